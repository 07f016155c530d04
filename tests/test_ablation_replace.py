"""The z-edit hooks of headlens.intervene.replace: what they do inside the block, and that on exit,
error or not, the model has no hook left and its weights are trainable again."""

from __future__ import annotations

import pytest
import torch

from headlens.heads import Head
from headlens.intervene.replace import ablation_hooks, z_edit_hooks

IDS = torch.tensor([[50256, 11, 12, 13, 14, 15]])  # [batch, pos]


def _n_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_ablation_hooks_zero_the_head_inside_and_leave_no_hook(small_model):
    model = small_model.model
    before = _n_hooks(model)
    with torch.no_grad():
        clean = model(input_ids=IDS).logits  # [batch, pos, d_vocab]
        with ablation_hooks(model, [Head(0, 1)]):
            ablated = model(input_ids=IDS).logits
        again = model(input_ids=IDS).logits
    assert not torch.allclose(clean, ablated) and torch.equal(clean, again)
    assert _n_hooks(model) == before


def test_ablation_hooks_are_removed_when_the_body_raises(small_model):
    model = small_model.model
    before = _n_hooks(model)
    with pytest.raises(RuntimeError, match="inside"), ablation_hooks(model, [Head(0, 1), Head(1, 0)]):
        assert _n_hooks(model) == before + 2  # one z hook per layer with an ablated head
        raise RuntimeError("inside")
    assert _n_hooks(model) == before


def test_z_edit_hooks_freeze_the_weights_and_restore_them_on_error(small_model):
    model = small_model.model
    before, seen = _n_hooks(model), []
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(RuntimeError, match="inside"), z_edit_hooks(model, lambda layer, z: seen.append(layer)):
        assert not any(p.requires_grad for p in model.parameters())
        with torch.no_grad():
            model(input_ids=IDS)
        raise RuntimeError("inside")
    assert seen == list(range(small_model.spec.n_layers))  # every layer's z went through edit, in order
    assert all(p.requires_grad for p in model.parameters())
    assert _n_hooks(model) == before
