"""Many head sets from one cached clean residual (headlens.intervene.stacked) equal full forward passes
with the same sets ablated by hooks (headlens.intervene.sums.ablated_sums)."""

from __future__ import annotations

import pytest
import torch

from headlens.ablation.ablate import ablate_heads
from headlens.heads import Head
from headlens.intervene.evalset import repeat_evalset, text_evalset
from headlens.intervene.replace import replacements
from headlens.intervene.stacked import first_layer, set_sums
from headlens.intervene.sums import ablated_sums
from tests.helpers.strong import sample_text

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

# Per-unit sums of float32 per-position values (losses of a few nats): the stacked run does the same
# operations on the same rows as the hooked forward pass, so only the batch layout of a stacked copy can
# move a sum, by float32 rounding (~1e-7 relative per operation over 2 layers): 1e-4 nats per unit sum.
SUM_ATOL = 1e-4

SETS = [[], [Head(1, 0), Head(1, 2)], [Head(0, 3), Head(1, 1)], [Head(1, 3)], [Head(0, 0), Head(0, 1), Head(1, 0)]]


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
@pytest.mark.parametrize("sets_per_pass", [1, 3])
def test_set_sums_equal_hooked_forward_passes(strong_model, method, sets_per_pass):
    evalset = repeat_evalset(strong_model, seed=1, n_seq=6, seq_len=12)
    reps = replacements(strong_model.model, evalset, method, seed=3, batch_size=4)
    stacked = set_sums(strong_model.model, evalset, SETS, reps, batch_size=4, sets_per_pass=sets_per_pass)
    hooked = torch.stack([ablated_sums(strong_model.model, evalset, s, reps, batch_size=4) for s in SETS])
    assert stacked.shape == hooked.shape == (len(SETS), evalset.n_units)
    assert (hooked - hooked[0]).abs().max() > 1.0  # the ablations change the metric
    assert torch.allclose(stacked, hooked, atol=SUM_ATOL, rtol=0), (stacked - hooked).abs().max()


def test_set_sums_from_a_later_layer_on_padded_text(strong_model):
    """Sets all in layer 1: layer 0 runs once per batch; right-padded windows, batches of 2."""
    for n_words in range(400, 800, 20):  # a length whose last evaluation window is short
        evalset = text_evalset(strong_model, sample_text(n_words))
        if not bool(evalset.mask.all()):
            break
    assert not bool(evalset.mask.all())  # padding is exercised
    sets = [[], [Head(1, 0)], [Head(1, 2), Head(1, 3)]]
    assert first_layer(sets, 2) == 1 and first_layer([[], []], 2) == 2
    reps = replacements(strong_model.model, evalset, "zero", seed=0, batch_size=2)
    stacked = set_sums(strong_model.model, evalset, sets, reps, batch_size=2, sets_per_pass=2)
    hooked = torch.stack([ablated_sums(strong_model.model, evalset, s, reps, batch_size=2) for s in sets])
    assert torch.allclose(stacked, hooked, atol=SUM_ATOL, rtol=0), (stacked - hooked).abs().max()


def test_a_controlled_ablation_reports_what_the_hooked_one_does(strong_model):
    """With controls, ablate_heads runs the set, the clean model and the controls stacked; the chosen
    set's numbers match the hooked run's, and each control's delta is that set's own hooked delta."""
    heads = [Head(1, 0), Head(1, 2)]
    alone = ablate_heads(strong_model, heads, metric="repeat", seed=2).meta
    controlled = ablate_heads(strong_model, heads, metric="repeat", seed=2, control=3).meta
    for key in ("clean", "ablated", "delta"):
        assert controlled[key] == pytest.approx(alone[key], abs=1e-5)
    assert controlled["n"] == alone["n"]
    for names, delta in zip(controlled["control"]["sets"], controlled["control"]["deltas"], strict=True):
        own = ablate_heads(strong_model, [Head(*map(int, n.split("."))) for n in names], metric="repeat", seed=2).meta
        assert delta == pytest.approx(own["delta"], abs=1e-5)


def test_a_batch_runs_at_its_own_width_and_matches_unpadded_runs(strong_model):
    """Each batch runs cut after its longest sequence (EvalSet.batch): a short last text window costs
    its own length, not the set's. The clean sums equal an independent computation: each window run
    alone, unpadded, through the Hugging Face model, cross-entropy summed at the counted positions."""
    for n_words in range(400, 800, 20):  # a length whose last evaluation window is short
        evalset = text_evalset(strong_model, sample_text(n_words))
        if not bool(evalset.mask.all()):
            break
    lengths = evalset.mask.sum(1)  # [n_seq]
    assert int(lengths.min()) < evalset.input_ids.shape[1]  # a short window exists
    model = strong_model.model
    widths = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, args, out: widths.append(out.shape[1]))
    try:
        reps = replacements(model, evalset, "zero", seed=0, batch_size=1)
        sums = set_sums(model, evalset, [[], [Head(1, 0)]], reps, batch_size=1)  # [2, n_units]
    finally:
        handle.remove()
    assert set(widths) == set(lengths.tolist()) and widths[-1] == int(lengths[-1])  # each batch at its own length
    expected = 0.0
    with torch.no_grad():
        for row, n in enumerate(lengths.tolist()):
            ids = evalset.input_ids[row, :n]  # [n]
            logits = model(input_ids=ids[None]).logits[0].double()  # [n, d_vocab]
            losses = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")  # [n - 1]
            expected += float(losses[evalset.counted[row, : n - 1]].sum())
    assert float(sums[0].sum()) == pytest.approx(expected, rel=1e-5)
    assert float((sums[1] - sums[0]).abs().max()) > 0  # the ablated set is a different run


def test_short_sequences_share_a_pass_by_default_and_give_the_same_result(strong_model):
    """With no batch size, an ablation fills BATCH_TOKENS at its longest sequence's length (never fewer
    than BATCH_SIZE sequences): 16 repeats of 2 x 12 tokens + BOS go in one pass, counted by a hook, and
    the result equals one sequence per pass."""
    from headlens.intervene.evalset import BATCH_SIZE, BATCH_TOKENS

    evalset = repeat_evalset(strong_model, seed=4, n_seq=16, seq_len=12)
    assert int(evalset.mask.sum(1).max()) == 25
    assert evalset.row_batches(None) == [slice(0, 16)]  # 16 x 25 = 400 tokens: one pass
    windows = text_evalset(strong_model, sample_text(600), window=BATCH_TOKENS)
    assert windows.row_batches(None) == windows.row_batches(BATCH_SIZE)  # long windows keep the fixed size
    model = strong_model.model
    passes = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, args, out: passes.append(out.shape[0]))
    try:
        default = ablate_heads(strong_model, [Head(1, 0)], metric="repeat", seed=4, control=3).meta
    finally:
        handle.remove()
    assert max(passes) == 16  # every sequence in one pass
    one = ablate_heads(strong_model, [Head(1, 0)], metric="repeat", seed=4, control=3, batch_size=1).meta
    for key in ("clean", "ablated", "delta"):
        assert default[key] == pytest.approx(one[key], abs=1e-5)
    assert default["control"]["deltas"] == pytest.approx(one["control"]["deltas"], abs=1e-5)


def _cost(cut: list[slice], lengths: list[int], pass_tokens: int) -> int:
    return sum((c.stop - c.start) * max(lengths[c]) + pass_tokens for c in cut)


@pytest.mark.parametrize("seed", range(6))
def test_packed_batches_cost_the_least_of_every_allowed_cut(seed):
    """packed_batches against every way of cutting the sequences into consecutive slices (2^(n-1) of them):
    each slice allowed (at most `least` sequences, or at most `budget` tokens at its longest), and none
    allowed costs less (padded tokens plus one pass's cost per slice)."""
    import itertools

    from headlens.intervene.evalset import packed_batches

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (9,), generator=gen).mul(8).tolist()  # 9 sequences of 8-64 tokens
    budget, least, pass_tokens = 96, 2, 12

    def allowed(c: slice) -> bool:
        return c.stop - c.start <= least or (c.stop - c.start) * max(lengths[c]) <= budget

    got = packed_batches(lengths, budget=budget, least=least, pass_tokens=pass_tokens)
    assert got[0].start == 0 and got[-1].stop == len(lengths)
    assert all(a.stop == b.start for a, b in itertools.pairwise(got)) and all(map(allowed, got))
    best = None
    for bits in itertools.product([0, 1], repeat=len(lengths) - 1):
        edges = [0] + [i + 1 for i, b in enumerate(bits) if b] + [len(lengths)]
        cut = [slice(a, b) for a, b in itertools.pairwise(edges)]
        if all(map(allowed, cut)):
            cost = _cost(cut, lengths, pass_tokens)
            best = cost if best is None else min(best, cost)
    assert _cost(got, lengths, pass_tokens) == best


def test_needle_tests_of_three_lengths_go_one_length_per_pass():
    """The report's 15 needle tests (5 each of 64, 128 and 256 tokens, in that order) at BATCH_TOKENS 1,024:
    5, 5, 4 and 1 per pass, 2,240 tokens, where 4 at a time run 2,560."""
    from headlens.intervene.evalset import BATCH_SIZE, batches, packed_batches

    lengths = [64] * 5 + [128] * 5 + [256] * 5
    got = packed_batches(lengths)
    assert got == [slice(0, 5), slice(5, 10), slice(10, 14), slice(14, 15)]
    assert _cost(got, lengths, 0) == 2240 and _cost(batches(15, BATCH_SIZE), lengths, 0) == 2560
