"""What the rotary-position families share: Llama, Mistral, Qwen2, Qwen3 and GPT-NeoX.

Each of them calls its attention module with keyword arguments `position_embeddings=(cos, sin)`
(computed once per forward by the base model's rotary module, the table's `rotary_emb`) and
`attention_mask` (built by transformers' `create_causal_mask`, or
`create_sliding_window_causal_mask` for sliding-window layers), projects the layer input to
per-head queries, keys and values, rotates q and k with the family's own `apply_rotary_pos_emb`
(the table's `rotary`; Su et al. 2021; GPT-NeoX rotates only the first `rotary_pct` of each
head's dimensions) and attends with each key/value head shared by n_heads / n_kv_heads
consecutive query heads (Ainslie et al. 2023; Hugging Face `repeat_kv`). The base adapter's
`context` and `hook_qkv` already follow the table; this class adds the weights the from-scratch
attention (headlens.arch.mha.GroupedQueryAttention) needs.
"""

from __future__ import annotations

import torch

from headlens.arch.base import Adapter, get_module
from headlens.arch.context import FULL, SLIDING
from headlens.arch.mha import AttentionWeights

__all__ = ["FULL", "SLIDING", "RotaryAdapter"]


class RotaryAdapter(Adapter):
    """Rotary positions, a per-layer causal or sliding-window mask, separate or fused Q/K/V."""

    def rotary_tables(self, layer: int) -> tuple[torch.Tensor, float]:
        """`layer`'s rotary inverse frequencies [d_head / 2] and the factor cos/sin are scaled by."""
        rotary = get_module(self.model, self.sites.rotary_emb)
        return rotary.inv_freq, float(rotary.attention_scaling)

    def attention_weights(self, layer: int) -> AttentionWeights:
        """Every weight and setting of `layer`'s attention: projections, rotary frequencies, q/k norms."""
        out = get_module(self.layer(layer), self.sites.o.projection)
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = self.qkv_weights(layer)
        inv_freq, rotary_scale = self.rotary_tables(layer)
        q_norm, k_norm = self.qk_norms(layer)
        return AttentionWeights(
            w_q=w_q,
            w_k=w_k,
            w_v=w_v,
            w_o=out.weight,
            b_q=b_q,
            b_k=b_k,
            b_v=b_v,
            b_o=out.bias,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            scale=self.attention_scale(layer),
            inv_freq=inv_freq,
            rotary_scale=rotary_scale,
            q_norm=None if q_norm is None else q_norm.weight,
            k_norm=None if k_norm is None else k_norm.weight,
            norm_eps=float(getattr(q_norm, "variance_epsilon", 1e-6)),
            window=self.sliding_window(layer),
        )
