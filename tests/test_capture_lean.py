"""The lean capture path: sdpa forward, patterns rebuilt in blocks of query rows, checked against z."""

from __future__ import annotations

import pytest
import torch

from headlens.arch.gpt2 import GPT2Adapter
from headlens.capture import CollectPatterns, Reducer, check_pattern, iter_batches, run_capture
from headlens.capture import lean as capture_lean
from headlens.errors import CaptureError, LeanCheckError
from headlens.scores.copying import CopyingReducer
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.positional import (
    ArgmaxOffsetReducer,
    current_token_reducer,
    first_token_reducer,
    prev_token_reducer,
)
from headlens.validate import VALIDATION_ATOL

# Unequal lengths (padding inside batches) that are not multiples of the block size below.
LENGTHS = [9, 5, 12, 3, 7, 11]
ROWS = 4  # query rows per block for one 12-token sequence in these tests: 3 blocks


def _small_blocks(monkeypatch, spec) -> None:
    """Blocks of ROWS rows for batch 1 x 12 tokens (and of 2 or 1 rows for larger batches)."""
    monkeypatch.setattr(capture_lean, "BLOCK_ELEMENTS", ROWS * spec.n_heads * 12)


@pytest.fixture(scope="module")
def sequences(small_model):
    gen = torch.Generator().manual_seed(1)
    bos = small_model.bos_token_id
    ids = []
    for n in LENGTHS:  # a repeated half gives duplicate and prefix-matching targets
        half = torch.randint(1000, 10000, ((n - 1 + 1) // 2,), generator=gen).tolist()
        ids.append([bos] + (half * 2)[: n - 1])
    return ids


def _scorers(model, spec):
    n, h = spec.n_layers, spec.n_heads
    copying_queries = lambda b: prefix_matching_targets(b.input_ids).any(-1)  # noqa: E731
    return {
        "prev": prev_token_reducer(n, h),
        "current": current_token_reducer(n, h),
        "first": first_token_reducer(n, h),
        "duplicate": duplicate_token_reducer(n, h),
        "prefix": prefix_matching_reducer(n, h),
        "argmax": ArgmaxOffsetReducer(n, h),
        "copying": CopyingReducer(model, copying_queries),
    }


def _stats(reducer) -> list[torch.Tensor]:
    if isinstance(reducer, ArgmaxOffsetReducer):
        return [reducer.counts.double(), reducer.n_scored.double()]
    if isinstance(reducer, CopyingReducer):
        return [reducer.result().double(), reducer.std().double(), reducer.counts.double()]
    return [
        reducer.result().double(),
        reducer.std().double(),
        reducer.seq_std().double(),
        reducer.mul_score().double(),
        reducer.counts.double(),
        reducer.n_seqs.double(),
    ]


@pytest.mark.parametrize("batch_size", [2, 6])
def test_blocks_give_every_scorer_the_eager_result(small_model, sequences, monkeypatch, batch_size):
    """Peer: the same reducers fed whole patterns by Hugging Face eager attention."""
    model, spec = small_model.model, small_model.spec
    _small_blocks(monkeypatch, spec)
    eager, lean = _scorers(model, spec), _scorers(model, spec)
    run_capture(model, iter_batches(sequences, batch_size, pad_id=0), list(eager.values()), recompute_patterns=False)
    run_capture(model, iter_batches(sequences, batch_size, pad_id=0), list(lean.values()))  # default: lean
    assert model.config._attn_implementation == "eager"  # restored after the sdpa run
    for name in eager:
        for want, got in zip(_stats(eager[name]), _stats(lean[name]), strict=True):
            torch.testing.assert_close(got, want, atol=VALIDATION_ATOL, rtol=0, equal_nan=True, msg=name)


class RecordBlocks(Reducer):
    wants = frozenset({"pattern"})
    row_blocks = True

    def __init__(self):
        self.blocks: list[tuple[int, int | None, int]] = []  # (layer, q_start, rows)

    def update(self, layer, batch, pattern=None, z=None, q_start=None):
        self.blocks.append((layer, q_start, pattern.shape[-2]))


def test_default_is_lean_only_when_every_pattern_reducer_takes_blocks(small_model, sequences, monkeypatch):
    _small_blocks(monkeypatch, small_model.spec)
    model = small_model.model
    batch = next(iter_batches(sequences[2:3], 1))  # the 12-token sequence alone
    alone = RecordBlocks()
    run_capture(model, [batch], [alone])
    assert [b for b in alone.blocks if b[0] == 0] == [(0, 0, 4), (0, 4, 4), (0, 8, 4)]
    mixed, collect = RecordBlocks(), CollectPatterns()
    run_capture(model, [batch], [mixed, collect])  # CollectPatterns wants whole patterns: eager hooks
    assert [b for b in mixed.blocks if b[0] == 0] == [(0, None, 12)]
    with torch.no_grad():
        hf = model(batch.input_ids, output_attentions=True).attentions
    for layer in range(small_model.spec.n_layers):
        assert torch.equal(collect.patterns[layer][0], hf[layer])  # the model's own, bit for bit


def test_z_check_catches_a_pattern_that_is_not_the_models(small_model, sequences, monkeypatch):
    """Rebuild the pattern with a wrong scale: causal and row-stochastic still, but not the model's.
    The per-block pattern check cannot see it; pattern @ V against the model's z does."""
    wrong = GPT2Adapter.attention_scale
    monkeypatch.setattr(GPT2Adapter, "attention_scale", lambda self, layer: 3.0 * wrong(self, layer))
    reducer = prev_token_reducer(small_model.spec.n_layers, small_model.spec.n_heads)
    with pytest.raises(LeanCheckError, match="layer 0: .*does not reproduce the model's z"):
        run_capture(small_model.model, iter_batches(sequences, 3, pad_id=0), [reducer])
    assert small_model.model.config._attn_implementation == "eager"
    run_capture(small_model.model, iter_batches(sequences, 3, pad_id=0), [reducer], check=False)  # unchecked: runs


def test_check_pattern_on_row_blocks():
    n = 10
    logits = torch.randn(2, 3, n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    pattern = logits.softmax(-1)  # [batch, head, q, k], causal
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 7:] = False
    for start in range(0, n, 3):
        check_pattern(pattern[:, :, start : start + 3], mask, layer=0, q_start=start)
    leaky = pattern[:, :, 3:6].clone()  # rows 3..5
    leaky[0, 1, 0] = 0.0
    leaky[0, 1, 0, 5] = 1.0  # row 3 puts all its mass on key 5, in its future
    with pytest.raises(CaptureError, match="not causal"):
        check_pattern(leaky, mask, layer=0, q_start=3)
    check_pattern(leaky, mask, layer=0, q_start=6)  # read as rows 6..8, key 5 is in the past


# A half-precision pattern carries ~eps(dtype) relative error per weight (bfloat16: 2^-8); the
# mean over positions of such a score stays within a few of those epsilons of float32's.
HALF_SCORE_ATOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_pass_the_checks_on_both_paths(small_model, sequences, dtype):
    import copy

    spec = small_model.spec
    half = copy.deepcopy(small_model.model).to(dtype)
    batches = list(iter_batches(sequences, 3, pad_id=0))
    want = prev_token_reducer(spec.n_layers, spec.n_heads)
    run_capture(small_model.model, batches, [want])
    for lean in (True, False):
        got = prev_token_reducer(spec.n_layers, spec.n_heads)
        run_capture(half, batches, [got], recompute_patterns=lean)  # the checks run and pass
        torch.testing.assert_close(got.result(), want.result(), atol=HALF_SCORE_ATOL[dtype], rtol=0)
