"""headlens.ablation.ablate: ablation at z against independent implementations (TransformerLens bridge,
a whole-layer z hook, captured reference z), bootstrap CIs, and the embedded model's induction heads."""

from __future__ import annotations

import pytest
import torch

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.heads import Head, all_heads
from headlens.intervene.evalset import EvalSet, repeat_evalset, text_evalset
from headlens.intervene.metrics import token_losses
from headlens.intervene.sums import ablated_sums
from tests.helpers.planted import build_planted
from tests.helpers.strong import build_strong_model, sample_text

# The bar for agreement with the TransformerLens bridge (a different forward implementation).
TL_ATOL = 1e-4
# Same model, same data, different float summation order: losses agree to float32 rounding.
SAME_PATH_ATOL = 1e-6


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def strong_model():
    """tests/helpers/strong.py's model with a 128-token context (overrides conftest's 64)."""

    return build_strong_model(n_positions=128)


def _bridge_sums(bridge, evalset: EvalSet, heads: list[Head]) -> torch.Tensor:
    """Per-sequence counted loss sums through the TransformerLens bridge, heads zeroed at hook_z."""

    def zero(value, hook, h):
        value[:, :, h] = 0.0  # hook_z [batch, pos, head, d_head]
        return value

    hooks = [(f"blocks.{h.layer}.attn.hook_z", lambda v, hook, h=h.head: zero(v, hook, h)) for h in heads]
    with torch.no_grad():
        logits = bridge.run_with_hooks(
            evalset.input_ids, attention_mask=evalset.mask.long(), fwd_hooks=hooks
        )  # [n_seq, pos, d_vocab]
    losses = token_losses(logits, evalset.input_ids, evalset.mask)  # [n_seq, pos-1]
    return torch.where(evalset.counted, losses, torch.zeros_like(losses)).sum(-1)  # [n_seq]


def _deltas_vs_bridge(loaded, evalset, heads):
    from headlens.intervene.sums import base_sums, sweep_sums
    from headlens.load.models import boot_bridge

    bridge = boot_bridge(loaded)
    tl_base = _bridge_sums(bridge, evalset, [])
    ours_base = base_sums(loaded.model, evalset)
    found = {}
    sweep_sums(loaded.model, evalset, heads, [None] * loaded.spec.n_layers, lambda h, s: found.update({h: s}))
    n = evalset.n_tokens
    ours = torch.tensor([float((found[h] - ours_base).sum() / n) for h in heads])
    theirs = torch.tensor([float((_bridge_sums(bridge, evalset, [h]) - tl_base).sum() / n) for h in heads])
    return ours, theirs


def test_zero_ablation_matches_transformer_lens_bridge(strong_model):
    evalset = repeat_evalset(strong_model, seed=3, n_seq=4)
    heads = all_heads(strong_model.spec.n_layers, strong_model.spec.n_heads)
    ours, theirs = _deltas_vs_bridge(strong_model, evalset, heads)
    assert ours.abs().max() > 100 * TL_ATOL  # the heads matter, so the comparison has teeth
    assert torch.allclose(ours, theirs, atol=TL_ATOL, rtol=0)


@pytest.mark.slow
def test_zero_ablation_matches_bridge_on_gpt2_shaped_model(gpt2_shaped_model):
    evalset = repeat_evalset(gpt2_shaped_model, seed=0, n_seq=2, seq_len=16)
    heads = [Head(0, 3), Head(5, 5), Head(11, 7)]
    ours, theirs = _deltas_vs_bridge(gpt2_shaped_model, evalset, heads)
    assert torch.allclose(ours, theirs, atol=TL_ATOL, rtol=0)


def test_no_head_gives_delta_zero_and_hugging_faces_loss(small_model):
    """Ablating no head runs the ablated pass too (no shortcut): its loss must equal both the
    clean pass and Hugging Face's own loss on the same windows (an independent computation)."""

    text = sample_text(300)
    result = ablate_heads(small_model, [], method="mean", text=text).meta
    assert result["delta"] == 0.0 and result["loss"] == result["loss_ablated"]
    evalset = text_evalset(small_model, text)
    labels = evalset.input_ids.masked_fill(~evalset.mask, -100)
    with torch.no_grad():
        hf = small_model.model(input_ids=evalset.input_ids, attention_mask=evalset.mask.long(), labels=labels).loss
    assert evalset.input_ids.shape[0] > 1  # several windows, the last one padded
    assert abs(result["loss_ablated"] - float(hf)) < 1e-5


def test_every_head_of_a_layer_equals_zeroing_the_layer_z(strong_model):
    """Independent: a hook that zeroes the whole input of c_proj of layer 0 (whose heads move
    this model's repeat loss by ~0.1 nats; layer 1's by ~1e-4 here)."""
    from headlens.capture import Batch, forward

    result = ablate_heads(strong_model, "layer:0", metric="repeat", seed=2).meta
    evalset = repeat_evalset(strong_model, seed=2)
    handle = strong_model.model.transformer.h[0].attn.c_proj.register_forward_pre_hook(
        lambda module, args: (torch.zeros_like(args[0]),)
    )
    try:
        with torch.no_grad():
            logits = forward(strong_model.model, Batch(evalset.input_ids, evalset.mask))
    finally:
        handle.remove()
    losses = token_losses(logits, evalset.input_ids, evalset.mask)[evalset.counted]
    assert result["heads"] == ["0.0", "0.1", "0.2", "0.3"]
    assert abs(result["loss_ablated"] - float(losses.double().mean())) < SAME_PATH_ATOL
    assert abs(result["delta_loss"]) > 100 * SAME_PATH_ATOL


def test_result_keys_and_ci(strong_model):
    result = ablate_heads(strong_model, "0.1,1.2", metric="repeat", seed=5).meta
    assert list(result)[:10] == ["model", "heads", "method", "metric", "unit", "n", "clean", "ablated", "delta", "ci95"]
    assert {"n_tokens", "loss", "loss_ablated", "delta_loss", "data", "reference", "resampled"} <= set(result)
    low, high = result["ci95"]
    assert low <= result["delta_loss"] <= high
    assert result["n_tokens"] == 16 * 24  # 16 sequences x (25 - 1) counted second-copy predictions
    again = ablate_heads(strong_model, "0.1,1.2", metric="repeat", seed=5).meta
    assert again == result  # deterministic under a seed


def test_mean_replacement_is_the_mean_of_captured_z_over_every_position(strong_model):
    """Peer: z captured by headlens.capture's own hooks over the evaluation set, averaged over
    every real position (the default reference is the evaluation set itself)."""
    from headlens.capture import CollectPatterns, iter_batches, run_capture
    from headlens.intervene.replace import replacements

    evalset = repeat_evalset(strong_model, seed=4, n_seq=3)
    reps = replacements(strong_model.model, evalset, "mean", seed=0, batch_size=2)
    collect = CollectPatterns(wants=("z",))
    run_capture(strong_model.model, iter_batches(evalset.input_ids, 2), [collect])
    for layer in range(strong_model.spec.n_layers):
        z = torch.cat(collect.zs[layer])  # [n_seq, pos, head, d_head]
        assert reps[layer].shape == (1, 1, 4, 16)
        assert torch.allclose(reps[layer][0, 0], z.mean((0, 1)), atol=SAME_PATH_ATOL)


def test_resample_draws_z_from_other_sequences(strong_model):
    from headlens.capture import CollectPatterns, iter_batches, run_capture
    from headlens.intervene.replace import replacements

    evalset = repeat_evalset(strong_model, seed=4, n_seq=5)
    reps = replacements(strong_model.model, evalset, "resample", seed=7, batch_size=2)
    collect = CollectPatterns(wants=("z",))
    run_capture(strong_model.model, iter_batches(evalset.input_ids, 2), [collect])
    z = torch.cat(collect.zs[0])  # [n_seq, pos, head, d_head]
    for seq in range(5):
        for pos in (0, 7, 30):
            got = reps[0][seq, pos]  # [head, d_head]
            sources = [
                (s, p)
                for s in range(5)
                for p in range(z.shape[1])
                if float((z[s, p] - got).abs().max()) < SAME_PATH_ATOL
            ]
            assert sources and all(s != seq for s, _ in sources)  # another sequence's z
    again = replacements(strong_model.model, evalset, "resample", seed=7, batch_size=2)
    assert torch.equal(again[0], reps[0])  # seeded


def test_ablated_sums_restores_the_model(strong_model):
    evalset = repeat_evalset(strong_model, seed=0, n_seq=2)
    before = ablated_sums(strong_model.model, evalset, [], [None, None])
    ablated_sums(strong_model.model, evalset, [Head(0, 0)], [None, None])
    assert torch.equal(before, ablated_sums(strong_model.model, evalset, [], [None, None]))


# The embedded model ---------------------------------------------------------------------------


def _tiny():
    from headlens.load.models import load_model

    return load_model("tiny")


@pytest.mark.slow
def test_zero_ablation_matches_bridge_on_the_embedded_model():
    tiny = _tiny()
    heads = all_heads(tiny.spec.n_layers, tiny.spec.n_heads)
    for evalset in (repeat_evalset(tiny, seed=0, n_seq=4), text_evalset(tiny, None, max_windows=4)):
        ours, theirs = _deltas_vs_bridge(tiny, evalset, heads)
        assert ours.abs().max() > 10 * TL_ATOL  # a trained model's heads matter
        assert torch.allclose(ours, theirs, atol=TL_ATOL, rtol=0)


@pytest.mark.slow
def test_tiny_induction_heads_raise_the_repeat_loss(tiny_classified):
    """Heads the classifier labels induction (ground truth from attention on repeated tokens,
    not from ablation) raise the second-copy loss when ablated, CI excluding 0; most heads
    without any role do not come close."""
    tiny, labels = tiny_classified  # classify_heads(tiny) under the default probes, once per session
    induction = [Head(r.layer, r.head) for r in labels.itertuples() if "induction" in r.labels]
    no_role = [Head(r.layer, r.head) for r in labels.itertuples() if not r.labels]
    assert induction, "classify_heads labels no head of the tiny model induction"
    sweep = sweep_heads(tiny, metric="repeat").frame.set_index(["layer", "head"])
    smallest = min(sweep.loc[tuple(h), "delta_loss"] for h in induction)
    for head in induction:
        assert sweep.loc[tuple(head), "ci95_low"] > 0
    if no_role:
        weak = [h for h in no_role if sweep.loc[tuple(h), "delta_loss"] < smallest / 2]
        assert len(weak) > len(no_role) / 2


# Planted ground truth ---------------------------------------------------------------------------

# A head with no planted role moves the second-copy loss by noise only (measured ~1e-4 nats);
# a planted induction circuit carries the whole copy (several nats). The bound sits between.
NO_ROLE_MAX_DELTA = 0.05


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_planted_induction_circuit_raises_the_repeat_loss(seed):
    """On a model whose induction head (K-composed with a previous-token head) is built by hand,
    zero-ablating either head of the circuit raises the second-copy loss with a CI excluding 0,
    and every head without a planted role stays within noise."""

    planted = build_planted(seed)
    sweep = sweep_heads(planted.loaded, metric="repeat", seed=seed).frame.set_index(["layer", "head"])
    circuit = [planted.positions["induction"], planted.positions["previous_token"]]
    for head in circuit:
        assert sweep.loc[head, "ci95_low"] > 0
        assert sweep.loc[head, "delta_loss"] > 1.0  # nats: the copy is gone
    roles = set(planted.positions.values())
    for head, row in sweep.iterrows():
        if head not in roles:
            assert abs(row["delta_loss"]) < NO_ROLE_MAX_DELTA, head
