"""The scoped hook context (headlens.arch.hooks): every hook it adds is gone on exit, error or
not; z and qkv hooks see what the model computes; the context carries the current batch."""

from __future__ import annotations

import pytest
import torch

from headlens.arch import adapter_for
from headlens.capture import Batch

IDS = torch.tensor([[50256, 11, 12, 13, 14, 15]])  # [batch, pos]


def _n_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _z_by_hand(model, layer):
    """z [batch, pos, head, d_head] from a pre-hook on GPT-2's c_proj, written here."""
    seen = []
    handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        with torch.no_grad():
            model(input_ids=IDS)
    finally:
        handle.remove()
    return seen[0].view(*seen[0].shape[:-1], model.config.n_head, -1)


def test_hooks_see_z_and_are_removed(small_model):
    model = small_model.model
    adapter = adapter_for(model)
    before, zs, qkvs = _n_hooks(model), [], []
    with adapter.hooks() as hooks, torch.no_grad():
        hooks.z(1, zs.append)
        hooks.qkv(1, lambda q, k, v: qkvs.append(q))
        hooks.output(adapter.attn(0), lambda output: None)
        assert _n_hooks(model) > before
        model(input_ids=IDS)
    assert _n_hooks(model) == before
    assert torch.equal(zs[0], _z_by_hand(model, 1))
    assert qkvs[0].shape == (1, adapter.n_heads, IDS.shape[1], adapter.d_head)


def test_hooks_are_removed_when_the_body_raises(small_model):
    model = small_model.model
    adapter = adapter_for(model)
    before = _n_hooks(model)
    with pytest.raises(RuntimeError, match="inside"), adapter.hooks() as hooks:
        hooks.z(0, lambda z: None)
        raise RuntimeError("inside")
    assert _n_hooks(model) == before


def test_a_replacement_from_a_z_hook_changes_the_output(small_model):
    model = small_model.model
    adapter = adapter_for(model)
    with torch.no_grad():
        clean = model(input_ids=IDS).logits
        with adapter.hooks() as hooks:
            hooks.z(0, torch.zeros_like)
            zeroed = model(input_ids=IDS).logits
        again = model(input_ids=IDS).logits
    assert not torch.allclose(clean, zeroed) and torch.equal(clean, again)


def test_hooks_carry_the_current_batch(small_model):
    model = small_model.model
    adapter = adapter_for(model)
    masks = []
    with adapter.hooks() as hooks, torch.no_grad():
        hooks.z(0, lambda z: masks.append(hooks.batch.mask.sum().item()))
        for length in (3, 5):
            hooks.batch = Batch(IDS[:, :length], torch.ones(1, length, dtype=torch.bool))
            model(input_ids=hooks.batch.input_ids)
    assert masks == [3, 5] and hooks.batch is None
