"""What every layer of one batch needs besides its residual stream: masks, positions, rotary cos/sin."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from headlens.arch.sites import get_module

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' names of the layer types
# The attention kernel of runs that read no pattern (ablation, sweeps, z captures): torch's fused
# scaled_dot_product_attention never builds the [pos, pos] softmax in memory, and is faster than eager
# (BENCHMARKS.md); eager stays the loaded default, for the patterns.
NO_PATTERN = "sdpa"


@dataclass
class LayerContext:
    """What every layer of one batch needs besides its residual stream."""

    input_ids: torch.Tensor  # [batch, pos]
    mask: torch.Tensor  # [batch, pos] bool, True on real tokens
    position_ids: torch.Tensor  # [1, pos]
    attn_mask: torch.Tensor | None  # additive or bool causal + padding mask from transformers, or None
    extra: dict  # family-specific keyword arguments of the attention module (rotary cos/sin, ...)
    layer_masks: dict = field(default_factory=dict)  # layer -> its own mask where it differs (sliding window)

    def attn_kwargs(self, copies: int = 1, layer: int | None = None) -> dict:
        """Keyword arguments of the attention module of `layer` for `copies` stacked copies of the batch."""
        mask = self.layer_masks.get(layer, self.attn_mask)
        if mask is not None and copies > 1:
            mask = mask.repeat(copies, *([1] * (mask.dim() - 1)))  # [copies * batch, 1, q_pos, k_pos]
        return {"attention_mask": mask, **self.extra}


def causal_masks(adapter, input_ids: torch.Tensor, mask: torch.Tensor):
    """What every family's layer context starts from, built as the base model's forward builds it:
    (ids, mask, position_ids [1, pos], embeds [batch, pos, d_model], the full-attention mask or None,
    {layer: sliding-window mask} for the sliding layers)."""
    device = next(adapter.model.parameters()).device
    ids, mask = input_ids.to(device), mask.to(device)  # [batch, pos]
    position_ids = torch.arange(ids.shape[1], device=device)[None]  # [1, pos]
    embeds = adapter.embed()(ids)  # [batch, pos, d_model]
    kwargs = dict(
        config=adapter.trunk().config,
        inputs_embeds=embeds,
        attention_mask=mask.long(),
        cache=None,
        position_ids=position_ids,
    )
    types = adapter.layer_types()
    full = create_causal_mask(**kwargs) if FULL in types else None  # [batch, 1, q_pos, k_pos] or None
    sliding = create_sliding_window_causal_mask(**kwargs) if SLIDING in types else None
    layer_masks = {layer: sliding for layer, kind in enumerate(types) if kind == SLIDING}
    return ids, mask, position_ids, embeds, full, layer_masks


def layer_context(adapter, input_ids: torch.Tensor, mask: torch.Tensor) -> LayerContext:
    """Masks (causal_masks) and rotary cos/sin, for families with a rotary module (the table's
    `rotary_emb`)."""
    ids, mask, position_ids, embeds, full, layer_masks = causal_masks(adapter, input_ids, mask)
    extra = {}
    if adapter.sites.rotary_emb is not None:
        extra["position_embeddings"] = get_module(adapter.model, adapter.sites.rotary_emb)(embeds, position_ids)
    return LayerContext(ids, mask, position_ids, full, extra=extra, layer_masks=layer_masks)


@contextlib.contextmanager
def attention_implementation(model, name: str):
    """Temporarily run every attention module of `model` with implementation `name` (masks built inside
    follow it: transformers' mask functions read the same config)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {key: cfg._attn_implementation for key, cfg in configs.items()}
    try:
        for cfg in configs.values():
            cfg._attn_implementation = name
        yield
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation = saved[key]
