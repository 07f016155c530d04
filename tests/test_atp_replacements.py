"""AtP and AtP* under every replacement the exact sweep takes (mean, resample, a counterfactual z):
the plain estimate equals grad_z . (r - z) computed here with plain hooks, and both estimates are the
first-order term of exact patching: on a float64 model, with each head's z moved a small step
eps (r - z) towards its replacement, |exact - estimate| shrinks as eps^2 (Taylor's theorem), so
relative to the effect it shrinks 10x when eps does."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config

from headlens.ablation.gradients import atp_star_deltas, attribution_deltas
from headlens.heads import all_heads
from headlens.intervene.evalset import repeat_evalset
from headlens.intervene.metrics import token_losses
from headlens.intervene.replace import capture_z, replacements
from headlens.intervene.sums import base_sums, sweep_sums
from headlens.load.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py
N_LAYERS, N_HEADS, D_HEAD = 3, 4, 8
ESTIMATES = {"atp": attribution_deltas, "atp*": atp_star_deltas}


@pytest.fixture(scope="module")
def model64():
    config = GPT2Config(n_layer=N_LAYERS, n_head=N_HEADS, n_embd=N_HEADS * D_HEAD, n_positions=64)
    config.initializer_range = 0.3  # a trained model's scale: heads move the loss nonlinearly
    loaded = build_model(config, seed=5, name="gpt2")
    loaded.model.double()
    return loaded


def _evalset(loaded):
    return repeat_evalset(loaded, seed=2, n_seq=3, seq_len=10)


def _clean_z(loaded, evalset) -> list[torch.Tensor]:
    """Each layer's clean z: [n_seq, pos, head, d_head] (the repeat set has no padding)."""
    out: list = [None] * N_LAYERS

    def keep(layer: int, rows: slice, z: torch.Tensor) -> None:
        if out[layer] is None:
            out[layer] = torch.zeros(*evalset.mask.shape, *z.shape[2:], dtype=z.dtype)
        out[layer][rows, : z.shape[1]] = z

    capture_z(loaded.model, evalset.input_ids, evalset.mask, None, keep)
    return out


def _exact(loaded, evalset, reps) -> torch.Tensor:
    """Every head patched alone to `reps` by the sweep: [layer, head]."""
    base, found = base_sums(loaded.model, evalset), {}
    heads = all_heads(N_LAYERS, N_HEADS)
    sweep_sums(loaded.model, evalset, heads, reps, lambda h, s: found.update({h: float((s - base).sum())}))
    return torch.tensor([[found[h] for h in heads]], dtype=torch.float64).view(N_LAYERS, N_HEADS) / evalset.n_tokens


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_attribution_is_grad_dot_replacement_minus_z(model64, method):
    """Peer: z kept with retain_grad through a pre-hook on c_proj, a plain backward of the mean counted
    loss, then sum(z.grad * (r - z)) per head, r the replacement broadcast to z's shape."""
    evalset = _evalset(model64)
    reps = replacements(model64.model, evalset, method, seed=0, batch_size=None)
    ours = attribution_deltas(model64.model, evalset, reps)  # [layer, head]
    kept = {}

    def keep(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:-1], N_HEADS, D_HEAD)  # [batch, pos, head, d_head]
            z.retain_grad()
            kept[layer] = z
            return (z.reshape(args[0].shape),)

        return hook

    model = model64.model
    handles = [model.transformer.h[i].attn.c_proj.register_forward_pre_hook(keep(i)) for i in range(N_LAYERS)]
    try:
        logits = model(input_ids=evalset.input_ids).logits  # [n_seq, pos, d_vocab]
        token_losses(logits, evalset.input_ids, evalset.mask)[evalset.counted].mean().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    theirs = torch.stack(
        [(kept[i].grad * (reps[i].expand_as(kept[i]) - kept[i])).sum((0, 1, 3)) for i in range(N_LAYERS)]
    ).detach()  # [layer, head]
    assert (theirs.abs() > 1e-4).all()  # every head moves the loss: the comparison is not of zeros
    # ours is summed in float64 and returned as float32: one float32 rounding of each figure
    torch.testing.assert_close(ours.double(), theirs, rtol=2 * torch.finfo(torch.float32).eps, atol=1e-9)


@pytest.mark.parametrize("kind", sorted(ESTIMATES))
@pytest.mark.parametrize("method", ["mean", "resample"])
def test_estimates_are_exact_to_first_order(model64, method, kind):
    """With r_eps = z + eps (r - z), exact patching is eps c_1 + O(eps^2) and both estimates give
    eps c_1 + O(eps^2) (AtP*'s corrections are second order), so the largest |exact - estimate|
    over the heads, relative to the largest |exact|, falls ~10x from eps = 1e-2 to 1e-3; at full
    replacement (eps = 1) the same model's error is far larger (the estimate is first order only)."""
    evalset = _evalset(model64)
    clean = _clean_z(model64, evalset)
    full = replacements(model64.model, evalset, method, seed=0, batch_size=None)
    errors = {}
    for eps in (1.0, 1e-2, 1e-3):
        reps = [
            z + eps * (r.expand_as(z) - z) for z, r in zip(clean, full, strict=True)
        ]  # each [n_seq, pos, head, d_head]
        exact = _exact(model64, evalset, reps)  # [layer, head]
        estimate = ESTIMATES[kind](model64.model, evalset, reps).double()  # [layer, head]
        errors[eps] = float((exact - estimate).abs().max() / exact.abs().max())
    assert errors[1e-3] < 0.2 * errors[1e-2]  # linear convergence of the relative error (0.1 ideally)
    assert errors[1.0] > 10 * errors[1e-2]
