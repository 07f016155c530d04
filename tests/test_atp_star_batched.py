"""AtP*'s QK fix batched across the ablated heads equals the same fix computed one head at a time,
written here independently: each head ablated through the model's own hooks, each later layer's z
read from the model's own attention, the linearised pattern change from torch.func.jvp of a masked
softmax. Float64 models (a random Llama with grouped-query attention, a random GPT-2), so the two
agree to the float32 rounding of the model's own softmax."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config

from headlens.ablation import gradients
from headlens.ablation.gradients import _clean_pass, _qk_correction
from headlens.heads import Head
from headlens.intervene.evalset import repeat_evalset
from headlens.intervene.replace import ablation_hooks, layer_replacement, replacements
from headlens.load.models import build_model
from tests.helpers.families import build_family

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py
EPS32 = torch.finfo(torch.float32).eps


def _model(name: str):
    if name == "gpt2":
        loaded = build_model(
            GPT2Config(n_layer=3, n_head=4, n_embd=32, n_positions=64, initializer_range=0.3), seed=3, name="gpt2"
        )
    else:
        loaded = build_family(name, seed=3)
    loaded.model.double()
    return loaded


def _qkvz(adapter, layer: int, resid: torch.Tensor, ctx):
    """The model's own q, k, v (k, v expanded to every query head) and z of `layer`, z [batch, head, pos, d_head]."""
    seen = []
    with adapter.hooks() as hooks:
        hooks.qkv(layer, lambda q, k, v: seen.append((q, k, v)))
        z, _ = adapter.attention(layer, resid, ctx)  # [batch, pos, head, d_head]
    q, k, v = seen[0]
    groups = q.shape[1] // k.shape[1]
    return q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), z.transpose(1, 2)


def _bias(mask: torch.Tensor, window: int | None) -> torch.Tensor:
    """-inf where a query may not see a key: causal, padding, sliding window. [batch, 1, q_pos, k_pos]"""
    pos = mask.shape[1]
    q, k = torch.arange(pos)[:, None], torch.arange(pos)[None]
    seen = (k <= q) & mask[:, None, None, :]  # [batch, 1, q_pos, k_pos]
    if window is not None:
        seen = seen & (q - k < window)
    bias = torch.zeros(seen.shape, dtype=torch.float64).masked_fill(~seen, float("-inf"))
    return bias.masked_fill(~seen.any(-1, keepdim=True), 0.0)  # rows with no key (none here) stay finite


@torch.no_grad()
def per_head_fix(loaded, evalset, rows: slice, clean: dict, reps) -> tuple[torch.Tensor, torch.Tensor]:
    """The QK fix of every head, one ablated head and one later layer at a time: [layer, head], and
    the bound on its rounding: the model's eager attention takes its softmax in float32 (each weight
    within eps32 of the float64 one, relative), so each z is within eps32 * max|v| per element."""
    adapter, model = loaded.adapter, loaded.model
    ctx, mask = clean["ctx"], evalset.mask[rows]
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)
    bound = torch.zeros_like(out)
    for layer in range(adapter.n_layers - 1):
        clean_next = adapter.block(layer, clean["resid"][layer], ctx)  # [batch, pos, d_model]
        for head in range(adapter.n_heads):
            rep = (
                None if reps[layer] is None else {Head(layer, head): layer_replacement(reps[layer], rows)[..., head, :]}
            )
            with ablation_hooks(model, [Head(layer, head)], rep):
                change = adapter.block(layer, clean["resid"][layer], ctx) - clean_next  # [batch, pos, d_model]
            for later in range(layer + 1, adapter.n_layers):
                resid = clean["resid"][later]
                q, k, v, z = _qkvz(adapter, later, resid, ctx)
                q2, k2, v2, z2 = _qkvz(adapter, later, resid + change, ctx)
                scale, bias = adapter.attention_scale(later), _bias(mask, adapter.sliding_window(later))
                scores = q @ k.transpose(-2, -1) * scale  # [batch, head, q_pos, k_pos]
                ds = q2 @ k2.transpose(-2, -1) * scale - scores  # [batch, head, q_pos, k_pos]
                a, da = torch.func.jvp(lambda s, bias=bias: torch.softmax(s + bias, -1), (scores,), (ds,))
                linear = da @ v + a @ (v2 - v)  # [batch, head, q_pos, d_head]: what attribution patching counts
                grad = clean["grad"][later].transpose(1, 2)  # [batch, head, pos, d_head]
                out[layer, head] += float((grad * (z2 - z - linear)).sum())
                v_max = v.abs().amax(-2, keepdim=True) + v2.abs().amax(-2, keepdim=True)  # [batch, head, 1, d_head]
                bound[layer, head] += float((grad.abs() * v_max).sum()) * EPS32
    return out, bound


@pytest.mark.parametrize(("name", "method"), [("llama-gqa", "zero"), ("gpt2", "zero"), ("llama-gqa", "mean")])
def test_batched_qk_fix_equals_per_head(name, method, monkeypatch):
    loaded = _model(name)
    evalset = repeat_evalset(loaded, seed=5, n_seq=3, seq_len=6)
    evalset.mask[1, -3:] = False  # a padded sequence: its padding must not leak into the fix
    evalset.counted[1, -3:] = False
    rows = slice(0, 3)
    reps = replacements(loaded.model, evalset, method, seed=0, batch_size=3)
    clean = _clean_pass(loaded.model, evalset, rows, reps)
    expected, bound = per_head_fix(loaded, evalset, rows, clean, reps)  # [layer, head]
    assert expected[:-1].abs().max() > 1e-3  # the fix is not trivially zero on these models
    assert (expected[-1] == 0).all()  # no later layer reads the last layer
    for chunk in (None, 1, 3):  # every head of a layer at once; one at a time; a ragged last chunk
        found = _qk_correction(loaded.model, evalset, rows, clean, chunk=chunk)
        assert ((found - expected).abs() <= bound).all(), (chunk, ((found - expected).abs() / bound).max())
    monkeypatch.setattr(gradients, "QK_FIX_ELEMENTS", 1)  # nothing fits: one head at a time, clean layers remade
    found = _qk_correction(loaded.model, evalset, rows, clean)
    assert ((found - expected).abs() <= bound).all(), ((found - expected).abs() / bound).max()
