"""The shipped tiny model through headlens's own capture: loads by name, the card's roles hold, and
TransformerLens's `detect_head` agrees (tests/test_shipped_models.py checks both shipped models
independently of headlens, from Hugging Face eager attention).

Thresholds are the embedded model's acceptance criteria, not fitted to the model:
- previous-token head: argmax on i-1 for >= 90% of held-out positions, BOS column excluded
  (Voita et al. 2019, arXiv 1905.09418);
- induction head: >= 0.5 mean attention from the second copy of [BOS, c, c] to the token after
  the earlier occurrence; second-copy loss >= 1 nat below the first copy; zero-ablating the
  induction heads raises second-copy loss by >= 0.5 nats (Olsson et al. 2022, arXiv 2209.11895);
- phase change: the best induction score rises from < 0.2 to > 0.5 within <= 1/5 of training
  while the ICL score falls.
TransformerLens `detect_head` is the peer for the attention scores it defines.
"""

from __future__ import annotations

import copy
import hashlib
import re

import pytest
import torch

from headlens.capture import forward, iter_batches, run_capture
from headlens.files import shipped_path
from headlens.heads import Head, parse_heads
from headlens.intervene.metrics import token_losses
from headlens.intervene.replace import ablation_hooks
from headlens.load.models import load_model
from headlens.probes.inputs import default_text, repeated_random_tokens, text_windows
from headlens.scores.icl import copy_losses, second_copy_induction_reducer
from headlens.scores.induction import prefix_matching_reducer
from headlens.scores.positional import ArgmaxOffsetReducer, prev_token_reducer
from headlens.training import PRINTABLE, TrainConfig, load_training_log, recipe

PREV_TOKEN_ARGMAX_SHARE = 0.9  # Voita et al.: >= 90% of tokens
INDUCTION_ATTENTION = 0.5  # mean second-copy attention on the induction target
COPY_LOSS_GAP = 1.0  # second copy >= 1 nat below the first
ABLATION_RISE = 0.5  # zero-ablating the induction heads together costs >= 0.5 nats on the second copy
PHASE_LOW, PHASE_HIGH, PHASE_WINDOW_SHARE = 0.2, 0.5, 0.2  # < 0.2 -> > 0.5 within 1/5 of training
SHIPPED_MAX_BYTES = 10 * 1024 * 1024  # all shipped files together
# TransformerLens runs the same weights through its own modules: float32 reassociation only.
PEER_ATOL = 1e-4
# A probe set unseen in training (the training log used TrainConfig.probe_seed).
TEST_PROBE_SEED, TEST_PROBE_SEQS, TEST_PROBE_LEN = 2024, 32, 100

pytestmark = pytest.mark.slow


def card_text() -> str:
    return (shipped_path("tiny") / "README.md").read_text(encoding="utf-8")


def card_field(name: str) -> str:
    match = re.search(rf"^{name}: (.+)$", card_text(), re.M)
    assert match, f"model card has no '{name}:' line"
    return match.group(1).strip()


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def claimed(tiny, role: str) -> list[Head]:
    """The heads the model card claims for a role ("none" when it claims none)."""
    field = card_field(role)
    return [] if field == "none" else parse_heads(field, tiny.spec.n_layers, tiny.spec.n_heads)


@pytest.fixture(scope="module")
def probe(tiny):
    """[BOS, c, c] with c 100 random printable-ASCII bytes: [32, 201]."""
    return repeated_random_tokens(
        TEST_PROBE_SEQS, TEST_PROBE_LEN, 2, *PRINTABLE, tiny.bos_token_id, seed=TEST_PROBE_SEED
    )


@pytest.fixture(scope="module")
def bridge(tiny):
    """TransformerLens bridge booted from the shipped directory around a copy of the model."""
    from transformer_lens import TransformerBridge

    return TransformerBridge.boot_transformers(
        str(shipped_path("tiny")), hf_model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer
    )


def second_copy_loss(model, probe, heads=()) -> tuple[float, float]:
    batch = next(iter_batches(probe, len(probe)))
    with torch.no_grad(), ablation_hooks(model, list(heads)):
        losses = token_losses(forward(model, batch), batch.input_ids, batch.mask)  # [n_seq, 2 * len]
    return copy_losses(losses, TEST_PROBE_LEN)


# Loading and the card -----------------------------------------------------------------------


def test_loads_by_name_with_its_tokenizer(tiny):
    from transformers import AutoTokenizer

    assert type(tiny.model).__name__ == "GPT2LMHeadModel"
    assert tiny.spec.n_ctx == TrainConfig().n_ctx and tiny.spec.d_vocab == 257
    tok = AutoTokenizer.from_pretrained(str(shipped_path("tiny")))
    assert tok.bos_token_id == tiny.bos_token_id == 256
    assert tok("Amen.", add_special_tokens=False)["input_ids"] == list(b"Amen.")


def test_weights_sha256_matches_the_card():
    digest = hashlib.sha256((shipped_path("tiny") / "model.safetensors").read_bytes()).hexdigest()
    assert digest == card_field("weights_sha256")


def test_shipped_files_fit_the_budget():
    folder = shipped_path("tiny")
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) <= SHIPPED_MAX_BYTES
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "heldout.txt",
        "training_log.csv",
        "training_heads.csv",
        "README.md",
        "CORPUS.md",
    ):
        assert (folder / name).is_file(), name


# (a) previous-token head ----------------------------------------------------------------------


def test_previous_token_head_argmax_on_heldout_text(tiny):
    windows = text_windows(tiny.tokenizer, default_text(), tiny.spec.n_ctx, tiny.bos_token_id)
    reducer = ArgmaxOffsetReducer(tiny.spec.n_layers, tiny.spec.n_heads)
    run_capture(tiny.model, iter_batches(windows, 32, pad_id=tiny.bos_token_id), [reducer])
    offset, share = reducer.result()  # [layer, head] each
    heads = claimed(tiny, "previous_token")
    assert heads
    for head in heads:
        assert offset[head].item() == -1, f"{head}: dominant offset {offset[head].item()}"
        assert share[head].item() >= PREV_TOKEN_ARGMAX_SHARE, f"{head}: share {share[head].item():.3f}"


def test_prev_token_score_agrees_with_transformer_lens(tiny, bridge):
    from transformer_lens.head_detector import detect_head

    text = default_text()[:2000]
    pieces = [text[i : i + 200] for i in range(0, 1000, 200)]  # 5 strings of 200 bytes -> 201 tokens
    ids = torch.tensor([[tiny.bos_token_id, *p.encode()] for p in pieces])  # [5, 201]
    ours = prev_token_reducer(tiny.spec.n_layers, tiny.spec.n_heads)
    run_capture(tiny.model, iter_batches(ids, 5), [ours])
    theirs = detect_head(bridge, pieces, "previous_token_head")  # sum(A * P) / sum(A): / 201 rows
    n = ids.shape[1]
    assert torch.allclose(theirs.float() * n / (n - 1), ours.result(), atol=PEER_ATOL)


# (b) induction heads ----------------------------------------------------------------------------


def test_induction_heads_attend_to_the_token_after_the_earlier_copy(tiny, probe):
    reducer = second_copy_induction_reducer(tiny.spec.n_layers, tiny.spec.n_heads, TEST_PROBE_LEN)
    run_capture(tiny.model, iter_batches(probe, 16), [reducer])
    scores = reducer.result()  # [layer, head]
    assert scores.max().item() >= INDUCTION_ATTENTION, f"best second-copy induction score {scores.max().item():.3f}"
    heads = claimed(tiny, "induction")
    assert heads
    for head in heads:
        assert scores[head].item() >= INDUCTION_ATTENTION, f"{head}: {scores[head].item():.3f}"


def test_induction_scores_agree_with_transformer_lens(tiny, bridge, probe):
    """Per sequence: TL's prefix-matching targets (all queries, then second-copy queries only)
    scored by `detect_head` equal headlens's reducers; the claimed heads pass on TL's numbers."""
    from transformer_lens.head_detector import detect_head, get_induction_head_detection_pattern

    n_layers, n_heads = tiny.spec.n_layers, tiny.spec.n_heads
    tl_second = []
    for row in probe[:4]:
        text = bytes(row[1:].tolist()).decode("ascii")  # TL's to_tokens prepends BOS: tokens == row
        ours_all, ours_second = (
            prefix_matching_reducer(n_layers, n_heads),
            second_copy_induction_reducer(n_layers, n_heads, TEST_PROBE_LEN),
        )
        run_capture(tiny.model, iter_batches(row[None], 1), [ours_all, ours_second])
        pattern = get_induction_head_detection_pattern(row[None])  # [pos, pos], TL's own targets
        for ours, keep_from in ((ours_all, 0), (ours_second, 1 + TEST_PROBE_LEN)):
            pattern[:keep_from] = 0  # second pass: keep the second copy's queries only
            n_scored = int((pattern.sum(-1) > 0).sum())
            theirs = detect_head(bridge, text, pattern.clone()) * len(row) / n_scored  # undo / sum(A) = / pos
            assert torch.allclose(theirs.float(), ours.result(), atol=PEER_ATOL)
        tl_second.append(theirs)
    for head in claimed(tiny, "induction"):
        assert torch.stack(tl_second).mean(0)[head].item() >= INDUCTION_ATTENTION


def test_second_copy_loss_is_far_below_the_first(tiny, probe):
    first, second = second_copy_loss(tiny.model, probe)
    assert second <= first - COPY_LOSS_GAP, (first, second)


def test_ablating_the_induction_heads_raises_second_copy_loss(tiny, probe):
    _, clean = second_copy_loss(tiny.model, probe)
    heads = claimed(tiny, "induction")
    assert heads, "the model card claims no induction head to ablate"
    _, ablated = second_copy_loss(tiny.model, probe, heads)
    assert ablated - clean >= ABLATION_RISE, (clean, ablated)


# (c) the phase change in the training log ----------------------------------------------------------


def test_training_log_shows_the_phase_change():
    run = load_training_log(shipped_path("tiny"))
    log, heads = run.frame, run.tables["heads"]
    total = int(log["step"].max())
    window = PHASE_WINDOW_SHARE * total
    found = []
    for _, low in log[log.best_induction_score < PHASE_LOW].iterrows():
        later = log[(log.step > low.step) & (log.step <= low.step + window) & (log.best_induction_score > PHASE_HIGH)]
        found += [(int(low.step), int(high.step)) for _, high in later.iterrows() if high.icl_score < low.icl_score]
    assert found, "no rise of the best induction score from < 0.2 to > 0.5 within 1/5 of training"
    start, end = (int(s) for s in card_field("phase_change_steps").split("-"))
    assert (start, end) in found
    config = recipe("gpt2")
    assert len(heads) == len(log) * config.n_layers * config.n_heads and int(heads.step.max()) == total


def test_final_log_row_matches_the_shipped_weights(tiny):
    """The log's last row was measured on these weights: re-measure with the logged probe."""
    config = recipe("gpt2")
    log = load_training_log(shipped_path("tiny")).frame
    ids = repeated_random_tokens(
        config.probe_seqs, config.probe_seq_len, 2, *PRINTABLE, tiny.bos_token_id, seed=config.probe_seed
    )
    reducer = second_copy_induction_reducer(tiny.spec.n_layers, tiny.spec.n_heads, config.probe_seq_len)
    run_capture(tiny.model, iter_batches(ids, 16), [reducer])
    assert reducer.result().max().item() == pytest.approx(log.best_induction_score.iloc[-1], abs=1e-5)
