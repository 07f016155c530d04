"""The TransformerLens bridge as a capture target: `blocks.{L}.attn.hook_pattern` and `hook_z`."""

from __future__ import annotations

import contextlib

from headlens.arch import adapter_for


def is_bridge(model) -> bool:
    """True for a TransformerLens TransformerBridge (or anything with TL-style hook points).

    A bridge forwards unknown attributes to the HF model it wraps, so it *also* has
    `.transformer`: test for TransformerLens's own attributes only.
    """
    return hasattr(model, "blocks") and hasattr(model, "hooks") and hasattr(model, "cfg")


def n_layers_of(model) -> int:
    return model.cfg.n_layers if is_bridge(model) else adapter_for(model).n_layers


def n_heads_of(model) -> int:
    return model.cfg.n_heads if is_bridge(model) else adapter_for(model).n_heads


@contextlib.contextmanager
def bridge_hooks(model, needs, dispatch):
    """Scoped TransformerLens hooks that hand each needed layer's pattern / z to `dispatch`."""
    names = {"pattern": "hook_pattern", "z": "hook_z"}
    fwd_hooks = []
    for layer, kinds in needs.items():
        for kind in kinds:

            def hook(value, hook, layer=layer, kind=kind):
                dispatch(layer, kind, value)
                return value

            fwd_hooks.append((f"blocks.{layer}.attn.{names[kind]}", hook))
    with model.hooks(fwd_hooks=fwd_hooks):
        yield
