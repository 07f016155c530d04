"""Parity with the peer: our "mul"-form previous-token, duplicate-token and induction scores equal
TransformerLens `detect_head` on the same token sequences.

detect_head (transformer_lens/head_detector.py) runs each prompt of a list separately, scores a
head as sum(A * P) / sum(A) over the whole [q, k] pattern (every row sums to 1, so this is the
target mass summed over queries / n_queries, queries without a target included) and returns the
mean over prompts. Our TargetMassReducer.mul_score() computes that form in the stream.
"""

from __future__ import annotations

import copy

import pytest
import torch

from headlens.capture import iter_batches, run_capture
from headlens.load.models import load_model
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer
from headlens.scores.positional import prev_token_reducer

# Both sides read the same float32 attention; sums over <= 128 x 128 entries differ by rounding only.
PARITY_ATOL = 1e-4

PROMPTS = [
    "The keeper climbed the stairs and trimmed the wick before the storm.",
    "Gulls circled the harbour while the boats came home, low in the water.",
    # a repeated passage: duplicate and induction targets on every token of the second copy
    "red kettle, seven lanterns, a brass spyglass near the eyepiece. " * 2,
    "Alpha beta gamma delta epsilon zeta eta theta. " * 3,
]


@pytest.fixture(scope="module")
def bridge_and_model(small_model_dir):
    from transformer_lens import TransformerBridge
    from transformers import AutoTokenizer

    loaded = load_model(str(small_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(small_model_dir))
    bridge = TransformerBridge.boot_transformers(
        str(small_model_dir),
        hf_model=copy.deepcopy(loaded.model),
        tokenizer=tokenizer,
        device="cpu",
        dtype=torch.float32,
    )
    return bridge, loaded


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, make",
    [
        ("previous_token_head", prev_token_reducer),
        ("duplicate_token_head", duplicate_token_reducer),
        ("induction_head", prefix_matching_reducer),
    ],
)
def test_mul_scores_equal_detect_head(bridge_and_model, name, make):
    from transformer_lens.head_detector import detect_head

    bridge, loaded = bridge_and_model
    expected = detect_head(bridge, PROMPTS, name)  # [n_layers, n_heads], mean over prompts
    sequences = [bridge.to_tokens(p)[0].tolist() for p in PROMPTS]  # BOS prepended, as detect_head does
    assert all(seq[0] == loaded.bos_token_id for seq in sequences)
    reducer = make(loaded.spec.n_layers, loaded.spec.n_heads)
    run_capture(loaded.model, iter_batches(sequences, batch_size=3, pad_id=0), [reducer])  # padded batches
    assert torch.allclose(reducer.mul_score(), expected.float(), atol=PARITY_ATOL), (reducer.mul_score(), expected)
    assert expected.abs().sum() > 0  # the peer scored something


@pytest.mark.slow
def test_our_capture_on_the_bridge_gives_the_same_scores(bridge_and_model):
    """The same reducer streamed through the bridge's hook_pattern agrees with the HF hooks."""
    bridge, loaded = bridge_and_model
    sequences = [bridge.to_tokens(p)[0].tolist() for p in PROMPTS]
    on_hf = prefix_matching_reducer(loaded.spec.n_layers, loaded.spec.n_heads)
    on_bridge = prefix_matching_reducer(loaded.spec.n_layers, loaded.spec.n_heads)
    run_capture(loaded.model, iter_batches(sequences, 4), [on_hf])
    run_capture(bridge, iter_batches(sequences, 4), [on_bridge])
    assert torch.allclose(on_hf.result(), on_bridge.result(), atol=PARITY_ATOL)
