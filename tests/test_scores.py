"""Score unit tests on synthetic patterns: each score against its definition, no model."""

from __future__ import annotations

import math

import pytest
import torch

from headlens.capture import Batch
from headlens.scores.copying import copying_per_query
from headlens.scores.duplicate import duplicate_token_reducer, duplicate_token_targets
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.positional import (
    ArgmaxOffsetReducer,
    current_token_reducer,
    first_token_reducer,
    offset_targets,
    prev_token_reducer,
)

# Float32 patterns, float64 accumulation: sums of <= 1e4 terms agree to well below 1e-5.
EXACT = 1e-5
N = 12  # positions of the synthetic sequences


def _batch(ids: torch.Tensor) -> Batch:
    return Batch(ids, torch.ones_like(ids, dtype=torch.bool))


def _offset_pattern(n: int, offset: int) -> torch.Tensor:
    """All mass on key q + offset (on key 0 where that does not exist): [1, 1, n, n]."""
    pattern = torch.zeros(n, n)
    for q in range(n):
        pattern[q, max(q + offset, 0)] = 1.0
    return pattern[None, None]


def _uniform(n: int) -> torch.Tensor:
    return (torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None])[None, None]  # [1, 1, q, k]


def test_perfect_previous_token_pattern_scores_one():
    reducer = prev_token_reducer(1, 1)
    reducer.update(0, _batch(torch.arange(N)[None]), pattern=_offset_pattern(N, -1))
    assert reducer.result().item() == pytest.approx(1.0, abs=EXACT)


def test_uniform_pattern_scores_one_over_position():
    """Uniform attention puts 1/(i+1) on key i-1 at query i: the mean of 1/(i+1) over i >= 1."""
    reducer = prev_token_reducer(1, 1)
    reducer.update(0, _batch(torch.arange(N)[None]), pattern=_uniform(N))
    expected = sum(1 / (i + 1) for i in range(1, N)) / (N - 1)
    assert reducer.result().item() == pytest.approx(expected, abs=EXACT)


def test_current_and_first_token_scores():
    cur, first = current_token_reducer(1, 1), first_token_reducer(1, 1)
    batch = _batch(torch.arange(N)[None])
    cur.update(0, batch, pattern=_offset_pattern(N, 0))
    first.update(0, batch, pattern=_offset_pattern(N, -N))  # everything on key 0
    assert cur.result().item() == pytest.approx(1.0, abs=EXACT)
    assert first.result().item() == pytest.approx(1.0, abs=EXACT)
    uniform_first = first_token_reducer(1, 1)
    uniform_first.update(0, batch, pattern=_uniform(N))
    assert uniform_first.result().item() == pytest.approx(sum(1 / (t + 1) for t in range(1, N)) / (N - 1), abs=EXACT)


def test_argmax_offset_finds_a_fixed_offset_and_ignores_bos():
    """Voita: the dominant relative offset and its share; the BOS column is excluded."""
    reducer = ArgmaxOffsetReducer(1, 2, max_offset=4)
    pattern = torch.cat([_offset_pattern(N, -2), _offset_pattern(N, -N)], dim=1)  # head 1: all on BOS
    pattern[:, 1] += 1e-3 * _offset_pattern(N, 0)[:, 0]  # ... and a sliver on itself
    reducer.update(0, _batch(torch.arange(N)[None]), pattern=pattern)
    offset, share = reducer.result()
    # head 0: queries 2 .. N-1 are scored; q = 2 has key 0 only at -2 (excluded), so N-3 of N-2 hit
    assert offset[0, 0].item() == -2 and share[0, 0].item() == pytest.approx((N - 3) / (N - 2))
    # head 1: with BOS excluded its argmax is the current token
    assert offset[0, 1].item() == 0 and share[0, 1].item() == pytest.approx(1.0)


def test_targets_match_their_definitions():
    ids = torch.tensor([[5, 7, 5, 9, 7]])
    dup = duplicate_token_targets(ids)[0]
    assert dup.nonzero().tolist() == [[2, 0], [4, 1]]  # q=2 (5) -> k=0; q=4 (7) -> k=1
    prefix = prefix_matching_targets(ids)[0]
    assert prefix.nonzero().tolist() == [[2, 1], [4, 2]]  # the token after the earlier copy
    assert offset_targets(ids, -1)[0].nonzero().tolist() == [[q, q - 1] for q in range(1, 5)]


def _induction_batch(period: int, repeats: int) -> tuple[Batch, torch.Tensor]:
    body = torch.randperm(50, generator=torch.Generator().manual_seed(0))[:period] + 100
    ids = torch.cat([torch.tensor([0]), body.repeat(repeats)])[None]  # [1, 1 + period * repeats]
    n = ids.shape[1]
    pattern = torch.zeros(n, n)
    for q in range(n):
        pattern[q, q - period + 1 if q > period else 0] = 1.0  # induction: the token after the last copy
    return _batch(ids), pattern[None, None]


def test_perfect_induction_pattern_scores_one_and_duplicate_zero():
    batch, pattern = _induction_batch(period=6, repeats=3)
    prefix, dup = prefix_matching_reducer(1, 1), duplicate_token_reducer(1, 1)
    prefix.update(0, batch, pattern=pattern)
    dup.update(0, batch, pattern=pattern)
    assert prefix.result().item() == pytest.approx(1.0, abs=EXACT)
    assert dup.result().item() == pytest.approx(0.0, abs=EXACT)
    assert prefix.counts[0].item() == 12  # the later two copies are scored


def test_mul_form_is_detect_heads_formula():
    """TransformerLens 'mul': sum(A * P) / sum(A) per sequence, then the mean over sequences."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4, (3, N), generator=gen)  # small vocabulary: many duplicates
    logits = torch.randn(3, 1, N, N, generator=gen).masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -1e9)
    pattern = logits.softmax(-1)  # [batch, head, q, k]
    reducer = duplicate_token_reducer(1, 1)
    reducer.update(0, _batch(ids), pattern=pattern)
    targets = duplicate_token_targets(ids).float()  # [batch, q, k]
    per_seq = (pattern[:, 0] * targets).sum((-1, -2)) / pattern[:, 0].sum((-1, -2))
    assert reducer.mul_score().item() == pytest.approx(per_seq.mean().item(), abs=EXACT)
    seq_means = [(pattern[b, 0] * targets[b]).sum(-1)[targets[b].any(-1)].mean() for b in range(3)]
    assert reducer.seq_std().item() == pytest.approx(torch.stack(seq_means).std(unbiased=False).item(), abs=EXACT)


def _unembed_stats(w_u: torch.Tensor) -> dict:
    w_u = w_u.double()
    mean = w_u.mean(0)
    return {
        "w_u": w_u,
        "mean": mean,
        "cov": w_u.T @ w_u / w_u.shape[0] - torch.outer(mean, mean),
        "rms": w_u.pow(2).mean().sqrt(),
        "gamma": torch.ones(w_u.shape[1], dtype=torch.float64),
    }


def test_copying_score_is_the_signed_gaussian_rank_of_the_attended_logit():
    gen = torch.Generator().manual_seed(0)
    w_u = torch.randn(2000, 32, generator=gen, dtype=torch.float64)  # [d_vocab, d_model]
    w_u -= w_u.mean(-1, keepdim=True)  # rows centred: the direct path's LN centring leaves them alone
    stats = _unembed_stats(w_u)
    tokens = torch.tensor([3, 17, 99])
    up = copying_per_query(w_u[tokens], tokens, stats)  # output = the token's own unembedding row
    down = copying_per_query(-w_u[tokens], tokens, stats)
    assert (up > 0.99).all() and (down < -0.99).all()
    out = torch.randn(3, 32, generator=gen, dtype=torch.float64)
    logits = (out - out.mean(-1, keepdim=True)) @ w_u.T  # [3, d_vocab] direct-path logits, by brute force
    z = (logits[torch.arange(3), tokens] - logits.mean(-1)) / logits.std(-1, unbiased=False)
    expected = torch.erf(z / math.sqrt(2))
    assert torch.allclose(copying_per_query(out, tokens, stats), expected, atol=1e-9)


def test_copying_score_is_zero_for_an_output_the_unembedding_cannot_read():
    w_u = torch.zeros(100, 8, dtype=torch.float64)
    w_u[:, :4] = torch.randn(100, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w_u[:, :4] -= w_u[:, :4].mean(-1, keepdim=True)
    w_u[:, 4:] = -w_u[:, :4].sum(-1, keepdim=True) / 4  # keep rows centred, unembedding blind to out below
    out = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    assert copying_per_query(out, torch.tensor([5]), _unembed_stats(w_u)).item() == 0.0


# Float32 z-scores from the factored mean/variance vs full [n, d_vocab] logits: rounding only.
COPYING_ATOL = 1e-4


@pytest.mark.slow
def test_copying_reducer_equals_brute_force_over_the_vocabulary(small_model):
    """The streamed, factored copying score equals its definition computed from full logits."""
    from headlens.capture import CollectPatterns, iter_batches, run_capture
    from headlens.probes.inputs import repeated_random_tokens
    from headlens.scores.copying import CopyingReducer

    model, spec = small_model.model, small_model.spec
    tokens = repeated_random_tokens(3, 10, 3, 1005, 10051, small_model.bos_token_id, seed=0)  # [3, 31]
    query_fn = lambda b: prefix_matching_targets(b.input_ids).any(-1)  # noqa: E731
    reducer, collect = CopyingReducer(model, query_fn), CollectPatterns(wants=("pattern", "z"))
    run_capture(model, iter_batches(tokens, 3), [reducer, collect])
    w_u = model.lm_head.weight.detach().double()  # [d_vocab, d_model]
    gamma = model.transformer.ln_f.weight.detach().double()
    scored = query_fn(Batch(tokens, torch.ones_like(tokens, dtype=torch.bool)))  # [batch, q_pos]
    for layer in range(spec.n_layers):
        pattern, z = collect.patterns[layer][0], collect.zs[layer][0]  # [b, h, q, k], [b, q, h, d_head]
        w_o = model.transformer.h[layer].attn.c_proj.weight.detach().double().view(spec.n_heads, spec.d_head, -1)
        for head in range(spec.n_heads):
            values = []
            for b, q in scored.nonzero().tolist():
                key = int(pattern[b, head, q, 1:].argmax()) + 1
                out = z[b, q, head].double() @ w_o[head]  # [d_model]
                logits = ((out - out.mean()) * gamma) @ w_u.T  # [d_vocab], every logit
                s = (logits[tokens[b, key]] - logits.mean()) / logits.std(unbiased=False)
                values.append(torch.erf(s / math.sqrt(2)).item())
            assert reducer.result()[layer, head].item() == pytest.approx(sum(values) / len(values), abs=COPYING_ATOL)


def test_fast_mass_paths_equal_the_target_product():
    """The diagonal / column shortcuts equal (pattern * targets).sum(-1), the definition."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, N, N, generator=gen).masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -1e9)
    pattern = logits.softmax(-1)  # [batch, head, q, k]
    ids = torch.arange(N).repeat(2, 1)
    for make in (prev_token_reducer, current_token_reducer, first_token_reducer):
        reducer = make(1, 3)
        targets = reducer.targets_fn(_batch(ids))  # [batch, q, k]
        assert torch.allclose(reducer.mass_fn(pattern, 0), (pattern * targets[:, None]).sum(-1), atol=1e-7)
        for start in range(N):  # blocks of query rows, as the lean capture path hands them over
            rows = slice(start, min(N, start + 3))
            block = pattern[:, :, rows]  # [batch, head, rows, k]
            want = (block * targets[:, None, rows]).sum(-1)  # [batch, head, rows]
            assert torch.allclose(reducer.mass_fn(block, start), want, atol=1e-7)
