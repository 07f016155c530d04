"""What the rotary-position families share: Llama, Mistral, Qwen2, Qwen3 and GPT-NeoX.

Each of them calls its attention module with keyword arguments `position_embeddings=(cos, sin)`
(computed once per forward by the base model's `rotary_emb`) and `attention_mask` (built by
transformers' `create_causal_mask`, or `create_sliding_window_causal_mask` for sliding-window
layers), projects the layer input to per-head queries, keys and values, rotates q and k with
the family's own `apply_rotary_pos_emb` (Su et al. 2021; GPT-NeoX rotates only the first
`rotary_pct` of each head's dimensions) and attends with each key/value head shared by
n_heads / n_kv_heads consecutive query heads (Ainslie et al. 2023; Hugging Face `repeat_kv`).

`hook_qkv` therefore records the module's own projections (forward hooks) and the cos/sin the
model handed to the attention (a forward pre-hook with kwargs), then applies the family's own
rotary function to them: the q and k it hands over are the ones the attention multiplies.
"""

from __future__ import annotations

import sys

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from headlens.arch.base import Adapter, LayerContext, get_module
from headlens.mha import AttentionWeights

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' names of the layer types


class RotaryAdapter(Adapter):
    """Rotary positions, a per-layer causal or sliding-window mask, separate or fused Q/K/V."""

    # Modules whose outputs are the layer's q, k and v as the rotary step receives them, relative
    # to the attention module: [batch, pos, heads * d_head] or already split [batch, pos, heads, d_head].
    qkv_sites: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")

    # Layer types and masks ----------------------------------------------------------------
    def layer_types(self) -> list[str]:
        """FULL or SLIDING per layer (transformers' `config.layer_types` where the family has it)."""
        types = getattr(self.config, "layer_types", None)
        if types is not None:
            return list(types)[: self.n_layers]
        return [FULL] * self.n_layers

    def sliding_window(self, layer: int) -> int | None:
        if self.layer_types()[layer] != SLIDING:
            return None
        return getattr(self.config, "sliding_window", None)

    def context(self, input_ids: torch.Tensor, mask: torch.Tensor) -> LayerContext:
        """Masks and rotary cos/sin built as the base model's forward builds them."""
        device = next(self.model.parameters()).device
        ids, mask = input_ids.to(device), mask.to(device)  # [batch, pos]
        position_ids = torch.arange(ids.shape[1], device=device)[None]  # [1, pos]
        trunk = self.trunk()
        embeds = self.embed()(ids)  # [batch, pos, d_model]
        kwargs = dict(config=trunk.config, inputs_embeds=embeds, attention_mask=mask.long(), cache=None,
                      position_ids=position_ids)
        types = self.layer_types()
        full = create_causal_mask(**kwargs) if FULL in types else None  # [batch, 1, q_pos, k_pos] or None
        sliding = create_sliding_window_causal_mask(**kwargs) if SLIDING in types else None
        layer_masks = {layer: sliding for layer, kind in enumerate(types) if kind == SLIDING}
        cos_sin = trunk.rotary_emb(embeds, position_ids)  # 2 x [1, pos, rotary_dim]
        return LayerContext(ids, mask, position_ids, full, extra={"position_embeddings": cos_sin},
                            layer_masks=layer_masks)

    # Q, K, V ------------------------------------------------------------------------------
    def rotary_function(self, layer: int):
        """The family's own `apply_rotary_pos_emb(q, k, cos, sin)` (from its modeling module)."""
        return sys.modules[type(self.attn(layer)).__module__].apply_rotary_pos_emb

    def split_qkv(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """q [batch, head, pos, d_head], k and v [batch, kv_head, pos, d_head] from the qkv_sites' outputs."""
        d_head = self.d_head
        heads = []
        for out in outputs:
            if out.dim() == 3:  # [batch, pos, heads * d_head]
                out = out.view(*out.shape[:-1], -1, d_head)  # [batch, pos, heads, d_head]
            heads.append(out.transpose(1, 2))  # [batch, heads, pos, d_head]
        return tuple(heads)

    def hook_qkv(self, layer: int, fn) -> list:
        attn = self.attn(layer)
        rotate = self.rotary_function(layer)
        seen: dict = {}

        def on_call(module, args, kwargs):
            seen.clear()
            seen["cos_sin"] = kwargs["position_embeddings"]  # 2 x [1 | batch, pos, rotary_dim]

        def keep(index: int):
            def hook(module, args, output):
                seen[index] = output.detach()
                if all(i in seen for i in range(len(self.qkv_sites))):
                    q, k, v = self.split_qkv([seen.pop(i) for i in range(len(self.qkv_sites))])
                    q, k = rotate(q, k, *seen["cos_sin"])  # [batch, head | kv_head, pos, d_head]
                    fn(q, k, v)

            return hook

        handles = [attn.register_forward_pre_hook(on_call, with_kwargs=True)]
        for index, site in enumerate(self.qkv_sites):
            handles.append(get_module(attn, site).register_forward_hook(keep(index)))
        return handles

    # Weights, for the from-scratch attention (headlens.mha) ----------------------------------
    def qkv_weights(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight [heads * d_head, d_model], bias or None) of the query, key and value projections."""
        attn = self.attn(layer)
        return [(m.weight, m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]

    def attention_weights(self, layer: int) -> AttentionWeights:
        """Every weight and setting of `layer`'s attention: projections, rotary frequencies, q/k norms."""
        attn, out = self.attn(layer), self.z_module(layer)
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = self.qkv_weights(layer)
        rotary = self.trunk().rotary_emb
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return AttentionWeights(
            w_q=w_q, w_k=w_k, w_v=w_v, w_o=out.weight, b_q=b_q, b_k=b_k, b_v=b_v, b_o=out.bias,
            n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, scale=self.attention_scale(layer),
            inv_freq=rotary.inv_freq, rotary_scale=float(rotary.attention_scaling),
            q_norm=None if q_norm is None else q_norm.weight, k_norm=None if k_norm is None else k_norm.weight,
            norm_eps=float(getattr(q_norm, "variance_epsilon", 1e-6)), window=self.sliding_window(layer))
