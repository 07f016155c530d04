"""Streaming capture: shapes, reducers vs full patterns, padding, hook hygiene, bridge parity."""

from __future__ import annotations

import pytest
import torch

from headlens.capture import (
    Batch,
    CollectPatterns,
    Reducer,
    check_pattern,
    forward,
    is_bridge,
    iter_batches,
    pad_batch,
    run_capture,
)
from headlens.errors import CaptureError
from headlens.scores.positional import prev_token_reducer

# Reducers accumulate in float64 from float32 patterns: agreement with a direct float32
# computation is limited by float32 rounding of the pattern values themselves.
REDUCER_ATOL = 1e-6
# The bridge recomputes attention in its own code path (measured differences ~1e-7 on z).
BRIDGE_ATOL = 1e-5
# Unequal lengths, so batches of 2 and 3 need padding.
LENGTHS = [9, 5, 12, 3, 7]


@pytest.fixture(scope="module")
def sequences(small_model):
    gen = torch.Generator().manual_seed(0)
    bos = small_model.bos_token_id
    return [[bos] + torch.randint(1000, 10000, (n - 1,), generator=gen).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def bridge(small_model):
    from headlens.load.models import boot_bridge

    return boot_bridge(small_model)


def hf_patterns(model, seq) -> list[torch.Tensor]:
    """Peer: Hugging Face's own output_attentions for one unpadded sequence, per layer."""
    with torch.no_grad():
        out = model(torch.tensor([seq]), output_attentions=True)
    return [a[0] for a in out.attentions]  # n_layers x [head, q_pos, k_pos]


class Boom(Reducer):
    """A reducer that fails inside the hook, counting its calls."""

    wants = frozenset({"pattern", "z"})

    def __init__(self):
        self.calls = 0

    def update(self, layer, batch, pattern=None, z=None):
        self.calls += 1
        raise RuntimeError("reducer failed")


def n_hf_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_shapes(small_model, sequences):
    collect = CollectPatterns(wants=("pattern", "z"))
    run_capture(small_model.model, iter_batches(sequences, batch_size=2), [collect])
    assert sorted(collect.patterns) == [0, 1]
    assert [p.shape for p in collect.patterns[0]] == [(2, 4, 9, 9), (2, 4, 12, 12), (1, 4, 7, 7)]
    assert [z.shape for z in collect.zs[1]] == [(2, 9, 4, 16), (2, 12, 4, 16), (1, 7, 4, 16)]


def test_layers_subset(small_model, sequences):
    collect = CollectPatterns(wants=("pattern",), layers=[1])
    run_capture(small_model.model, iter_batches(sequences, batch_size=5), [collect])
    assert list(collect.patterns) == [1] and collect.zs == {}


def test_patterns_match_hf_output_attentions(small_model, sequences):
    """Captured (padded) patterns equal HF's own output_attentions on each sequence alone."""
    collect = CollectPatterns()
    run_capture(small_model.model, iter_batches(sequences, batch_size=5), [collect])
    for row, seq in enumerate(sequences):
        n = len(seq)
        for layer, expected in enumerate(hf_patterns(small_model.model, seq)):
            got = collect.patterns[layer][0][row, :, :n, :n]  # [head, q_pos, k_pos] of the real tokens
            torch.testing.assert_close(got, expected, atol=REDUCER_ATOL, rtol=0)


def test_reducer_over_batches_equals_statistic_from_full_patterns(small_model, sequences):
    """prev_token_score (mean of A[i, i-1], Olsson et al.) streamed over 3 batches vs direct."""
    spec = small_model.spec
    reducer = prev_token_reducer(spec.n_layers, spec.n_heads)
    run_capture(small_model.model, iter_batches(sequences, batch_size=2), [reducer])
    per_layer = [[] for _ in range(spec.n_layers)]
    for seq in sequences:
        for layer, pattern in enumerate(hf_patterns(small_model.model, seq)):
            per_layer[layer].append(pattern.diagonal(offset=-1, dim1=-2, dim2=-1))  # [head, pos - 1]
    expected = torch.stack([torch.cat(diags, dim=-1).mean(-1) for diags in per_layer])  # [layer, head]
    torch.testing.assert_close(reducer.result(), expected, atol=REDUCER_ATOL, rtol=0)
    assert reducer.counts.tolist() == [sum(n - 1 for n in LENGTHS)] * spec.n_layers


def test_padding_does_not_change_statistics(small_model, sequences):
    spec = small_model.spec
    results = []
    for batch_size, pad_id in [(1, 0), (5, 0), (5, 50256), (2, 13)]:
        reducer = prev_token_reducer(spec.n_layers, spec.n_heads)
        run_capture(small_model.model, iter_batches(sequences, batch_size=batch_size, pad_id=pad_id), [reducer])
        results.append(reducer.result())
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], atol=REDUCER_ATOL, rtol=0)


def test_pad_batch_and_tensor_batches():
    ids, mask = pad_batch([[1, 2, 3], [4]], pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    batches = list(iter_batches(torch.arange(12).view(3, 4), batch_size=2))
    assert [b.input_ids.shape for b in batches] == [(2, 4), (1, 4)]
    assert [b.offset for b in batches] == [0, 2] and bool(batches[1].mask.all())


def test_same_capture_api_on_transformer_bridge(small_model, bridge, sequences):
    assert is_bridge(bridge) and not is_bridge(small_model.model)
    hf, tl = CollectPatterns(wants=("pattern", "z")), CollectPatterns(wants=("pattern", "z"))
    run_capture(small_model.model, iter_batches(sequences, batch_size=5), [hf])
    run_capture(bridge, iter_batches(sequences, batch_size=5), [tl])
    mask = iter_batches(sequences, batch_size=5).__next__().mask  # [batch, pos]
    for layer in range(small_model.spec.n_layers):
        real_q = mask[:, None, :, None].expand_as(hf.patterns[layer][0])  # [batch, head, q_pos, k_pos]
        torch.testing.assert_close(
            tl.patterns[layer][0][real_q], hf.patterns[layer][0][real_q], atol=BRIDGE_ATOL, rtol=0
        )
        torch.testing.assert_close(tl.zs[layer][0][mask], hf.zs[layer][0][mask], atol=BRIDGE_ATOL, rtol=0)


def test_forward_logits_agree_on_bridge(small_model, bridge, sequences):
    batch = next(iter_batches(sequences, batch_size=5))
    with torch.no_grad():
        hf, tl = forward(small_model.model, batch), forward(bridge, batch)
    torch.testing.assert_close(tl[batch.mask], hf[batch.mask], atol=BRIDGE_ATOL, rtol=0)


def test_progress_bar_is_opt_in(small_model, sequences, capsys):
    run_capture(small_model.model, iter_batches(sequences, batch_size=2), [CollectPatterns()])
    assert capsys.readouterr().err == ""
    run_capture(small_model.model, iter_batches(sequences, batch_size=2), [CollectPatterns()], progress=True)
    assert "capture" in capsys.readouterr().err


def test_recomputed_patterns_match_eager(small_model, sequences):
    """Opt-in lean mode (sdpa forward, patterns rebuilt from each layer's Q and K) vs HF eager capture."""
    from headlens.validate import VALIDATION_ATOL

    spec = small_model.spec
    eager, lean = CollectPatterns(wants=("pattern", "z")), CollectPatterns(wants=("pattern", "z"))
    eager_prev, lean_prev = (
        prev_token_reducer(spec.n_layers, spec.n_heads),
        prev_token_reducer(spec.n_layers, spec.n_heads),
    )
    run_capture(small_model.model, iter_batches(sequences, batch_size=5), [eager, eager_prev])
    run_capture(small_model.model, iter_batches(sequences, batch_size=5), [lean, lean_prev], recompute_patterns=True)
    assert small_model.model.config._attn_implementation == "eager"  # restored
    mask = next(iter_batches(sequences, batch_size=5)).mask  # [batch, pos]
    for layer in range(spec.n_layers):
        real_q = mask[:, None, :, None].expand_as(eager.patterns[layer][0])  # [batch, head, q_pos, k_pos]
        torch.testing.assert_close(
            lean.patterns[layer][0][real_q], eager.patterns[layer][0][real_q], atol=VALIDATION_ATOL, rtol=0
        )
        torch.testing.assert_close(lean.zs[layer][0][mask], eager.zs[layer][0][mask], atol=VALIDATION_ATOL, rtol=0)
    torch.testing.assert_close(lean_prev.result(), eager_prev.result(), atol=VALIDATION_ATOL, rtol=0)


# Errors -----------------------------------------------------------------------------------


def test_recompute_restores_eager_after_an_error(small_model, sequences, bridge):
    with pytest.raises(RuntimeError, match="reducer failed"):
        run_capture(small_model.model, iter_batches(sequences, batch_size=2), [Boom()], recompute_patterns=True)
    assert small_model.model.config._attn_implementation == "eager"
    assert small_model.model.transformer.h[0].attn.config._attn_implementation == "eager"
    with pytest.raises(CaptureError, match="Hugging Face models"):
        run_capture(bridge, iter_batches(sequences, batch_size=2), [CollectPatterns()], recompute_patterns=True)


def test_hooks_are_gone_after_an_exception_in_a_reducer(small_model, sequences):
    before = n_hf_hooks(small_model.model)
    boom = Boom()
    with pytest.raises(RuntimeError, match="reducer failed"):
        run_capture(small_model.model, iter_batches(sequences, batch_size=2), [boom])
    assert n_hf_hooks(small_model.model) == before
    calls = boom.calls
    forward(small_model.model, next(iter_batches(sequences, batch_size=2)))
    assert boom.calls == calls  # nothing left that calls it


def test_bridge_hooks_are_gone_after_an_exception(bridge, sequences):
    boom = Boom()
    with pytest.raises(RuntimeError, match="reducer failed"):
        run_capture(bridge, iter_batches(sequences, batch_size=2), [boom])
    calls = boom.calls
    with torch.no_grad():
        forward(bridge, next(iter_batches(sequences, batch_size=2)))
    assert calls == 1 and boom.calls == calls


def _corrupting_hook(kind):
    def hook(module, args, output):
        pattern = output[1]  # [batch, head, q_pos, k_pos]
        bad = pattern.transpose(-1, -2) if kind == "non_causal" else pattern * 1.5
        return (output[0], bad)

    return hook


@pytest.mark.parametrize("kind, message", [("non_causal", "not causal"), ("unnormalised", "do not sum to 1")])
def test_pattern_check_catches_a_bad_pattern_in_a_run(small_model, sequences, kind, message):
    """A hook registered before ours corrupts the pattern the model returns: the check sees it."""
    attn = small_model.model.transformer.h[1].attn
    handle = attn.register_forward_hook(_corrupting_hook(kind))
    try:
        with pytest.raises(CaptureError, match=f"layer 1: .*{message}"):
            run_capture(small_model.model, iter_batches(sequences, batch_size=2), [CollectPatterns()])
        run_capture(small_model.model, iter_batches(sequences, batch_size=2), [CollectPatterns()], check=False)
    finally:
        handle.remove()


def test_check_pattern_on_synthetic_patterns():
    mask = torch.tensor([[True, True, True, False]])  # [batch, pos]
    good = torch.tensor([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.4, 0.6, 0, 0]])[None, None]
    check_pattern(good, mask, layer=0)  # padded row 3 sums to 1 too, but is not required to
    future = good.clone()
    future[0, 0, 1] = torch.tensor([0.5, 0.25, 0.25, 0])
    with pytest.raises(CaptureError, match="not causal"):
        check_pattern(future, mask, layer=0)
    short = good.clone()
    short[0, 0, 2, 2] = 0.1
    with pytest.raises(CaptureError, match="do not sum to 1"):
        check_pattern(short, mask, layer=3)
    negative = good.clone()
    negative[0, 0, 2] = torch.tensor([0.6, -0.1, 0.5, 0])
    with pytest.raises(CaptureError, match="negative"):
        check_pattern(negative, mask, layer=0)
    padded_row_off = good.clone()
    padded_row_off[0, 0, 3] = 0.0  # a padded query may be anything
    check_pattern(padded_row_off, mask, layer=0)


def test_sdpa_model_gives_a_clear_error(small_config):
    from headlens.load.models import build_model

    loaded = build_model(small_config, seed=0)
    loaded.model.config._attn_implementation = "sdpa"
    batch = Batch(*pad_batch([[50256, 1, 2]]))
    with pytest.raises(CaptureError, match="eager"):
        run_capture(loaded.model, [batch], [CollectPatterns()])


def test_out_of_range_reducer_layer(small_model, sequences):
    with pytest.raises(CaptureError, match="layer 5 is out of range"):
        run_capture(small_model.model, iter_batches(sequences, batch_size=2), [CollectPatterns(layers=[5])])
