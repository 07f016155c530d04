"""headlens.ablation.prune: Michel et al.'s importance against finite differences, the pruning curve's
end points against Hugging Face's own loss and a whole-z hook, and the +5% count."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

from headlens.ablation.gradients import head_importance, normalize_by_layer
from headlens.ablation.prune import heads_within, prune_curve
from headlens.errors import ConfigError, InputTextError
from headlens.intervene.evalset import EvalSet, text_evalset
from tests.helpers.strong import sample_text

# Loss of one float32 forward vs another implementation of the same forward (HF's own loss).
SAME_LOSS_ATOL = 1e-5
# Gradient by autograd (float32) vs central finite difference on a float64 copy (eps 1e-4).
FD_RTOL, FD_ATOL = 1e-3, 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def _gated_seq_losses(model, evalset: EvalSet, layer: int, head: int, value: float) -> torch.Tensor:
    """Per-sequence mean counted loss with head (layer, head)'s z scaled by `value`: [n_seq],
    in the model's dtype (token_losses would round float64 logits to float32)."""

    def hook(module, args):
        z = args[0].view(*args[0].shape[:-1], 4, -1).clone()  # [batch, pos, head, d_head]
        z[:, :, head] *= value
        return (z.view(args[0].shape),)

    handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            logits = model(input_ids=evalset.input_ids, attention_mask=evalset.mask.long()).logits
    finally:
        handle.remove()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # [n_seq, pos-1, d_vocab]
    losses = -logp.gather(-1, evalset.input_ids[:, 1:, None])[..., 0]  # [n_seq, pos-1]
    losses = torch.where(evalset.counted, losses, torch.zeros_like(losses))
    return losses.sum(-1) / evalset.counted.sum(-1)


@pytest.mark.slow
def test_importance_matches_finite_differences(strong_model):
    evalset = text_evalset(strong_model, sample_text(200))
    keep = torch.ones(2, 4, dtype=torch.bool)
    ours = head_importance(strong_model.model, evalset, keep)  # [layer, head]
    model64 = copy.deepcopy(strong_model.model).double()
    eps = 1e-4
    fd = torch.zeros(2, 4, dtype=torch.float64)
    for layer in range(2):
        for head in range(4):
            up = _gated_seq_losses(model64, evalset, layer, head, 1 + eps)
            down = _gated_seq_losses(model64, evalset, layer, head, 1 - eps)
            fd[layer, head] = ((up - down) / (2 * eps)).abs().mean()  # Michel: E_x |dL(x)/dxi|
    assert fd.max() > 1e-2  # gates matter
    assert torch.allclose(ours.double(), fd, rtol=FD_RTOL, atol=FD_ATOL)


def test_normalize_by_layer_gives_unit_norm_over_kept_heads():
    importance = torch.tensor([[3.0, 4.0, 1.0], [1.0, 1.0, 1.0]])
    keep = torch.tensor([[True, True, False], [True, True, True]])
    normed = normalize_by_layer(importance, keep)
    assert torch.allclose(normed[0], torch.tensor([0.6, 0.8, 0.0]))
    assert torch.allclose(normed.norm(dim=1), torch.ones(2))


def test_prune_curve(strong_model):
    text = sample_text(260)
    curve = prune_curve(strong_model, text=text).frame
    assert list(curve.columns) == ["step", "n_removed", "fraction_removed", "heads_removed", "step_heads", "loss"]
    assert curve.n_removed.tolist() == list(range(9))  # round(10% of 8) = 1 head per step
    assert curve.fraction_removed.iloc[-1] == 1.0
    removed = [set(filter(None, s.split(","))) for s in curve.heads_removed]
    assert all(a < b for a, b in zip(removed, removed[1:], strict=False))  # each step adds heads

    # Step 0 = Hugging Face's own mean loss on the evaluation windows (the even ones).
    windows = text_evalset(strong_model, text)
    ids, mask = windows.input_ids[0::2], windows.mask[0::2]
    labels = ids.masked_fill(~mask, -100)
    with torch.no_grad():
        hf = strong_model.model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    assert abs(curve.loss.iloc[0] - float(hf)) < SAME_LOSS_ATOL

    # Last step = every layer's whole z zeroed.
    handles = [
        block.attn.c_proj.register_forward_pre_hook(lambda m, a: (torch.zeros_like(a[0]),))
        for block in strong_model.model.transformer.h
    ]
    try:
        with torch.no_grad():
            zeroed = strong_model.model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    finally:
        for handle in handles:
            handle.remove()
    assert abs(curve.loss.iloc[-1] - float(zeroed)) < SAME_LOSS_ATOL


def test_heads_within():
    curve = pd.DataFrame({"n_removed": [0, 2, 4, 6, 8], "loss": [2.0, 2.05, 2.09, 2.2, 2.08]})
    assert heads_within(curve) == 4  # 2.2 > 2.1 stops the count, even though 8 comes back under
    assert heads_within(curve, tolerance=0.2) == 8


def test_errors(strong_model):
    with pytest.raises(ConfigError, match="step_fraction"):
        prune_curve(strong_model, text=sample_text(260), step_fraction=0)
    with pytest.raises(InputTextError, match="second window"):
        prune_curve(strong_model, text="the" + " the" * 62)  # exactly one 64-token window


def test_removal_by_role_ranks_and_permutation_p_value():
    """4 heads, the one labelled head removed last: mean ranks 4 vs 2 and, under random
    relabelling, P(rank >= 4) = 1/4 exactly (the permutation estimate within Monte Carlo noise)."""
    from headlens.ablation.prune import removal_by_role
    from headlens.heads import Head

    curve = pd.DataFrame({"step_heads": ["", "0.1", "1.0,0.0", "1.1"]})
    labels = {Head(0, 0): [], Head(0, 1): [], Head(1, 0): [], Head(1, 1): ["induction"]}
    order = removal_by_role(curve, labels, seed=3)
    assert order["mean_rank_labelled"] == 4.0 and order["mean_rank_unlabelled"] == 2.0
    assert abs(order["p_value"] - 0.25) < 0.015  # 10,000 shuffles: sd ~0.004
    assert removal_by_role(curve, labels, seed=3) == order  # seeded
    early = {**labels, Head(1, 1): [], Head(0, 1): ["previous_token"]}
    assert removal_by_role(curve, early, seed=3)["p_value"] == pytest.approx(1.0, abs=1e-9)  # removed first


def test_prune_curve_marks_labelled_heads(strong_model):
    from headlens.heads import Head

    labels = {Head(layer, head): [] for layer in range(2) for head in range(4)}
    labels[Head(1, 2)] = ["induction"]
    curve = prune_curve(strong_model, text=sample_text(260), labels=labels).frame
    marked = [s for s in curve.step_labelled if s]
    assert marked == ["1.2:induction"]
    step = curve.index[curve.step_labelled == "1.2:induction"][0]
    assert curve.step_heads[step] == "1.2"
