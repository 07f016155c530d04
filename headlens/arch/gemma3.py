"""Gemma 3 text models (`Gemma3ForCausalLM`, model_type `gemma3_text`; Gemma Team 2025, arXiv 2503.19786).

Sites: `model.layers[L]`:
  x' = x + post_attention_layernorm(o_proj(attention(input_layernorm(x))))
  x'' = x' + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x')))
then `model.norm`, `lm_head` (tied to the embedding). What differs from Llama:
- every RMSNorm multiplies by (1 + weight), in float32 before the cast (Gemma3RMSNorm);
- the norm after attention sits *before* the residual add, so a layer's attention output
  (`attention`'s attn_out, the o_proj output, linear in each head's z) is normalised in
  `finish_block`, not in `attention`;
- each head's query and key get that RMSNorm (`q_norm`, `k_norm`, over d_head, after the
  projection and the split into heads, before the rotary step);
- Q K^T is scaled by query_pre_attn_scalar^-0.5, not d_head^-0.5 (the attention's `scaling`);
- `config.layer_types` interleaves sliding-window layers (keys at most sliding_window - 1
  positions back) with global layers, and each layer type has its own rotary base and rope
  scaling (`rope_parameters[layer_type]`): the base model computes one (cos, sin) per type
  (`rotary_emb(x, position_ids, layer_type)`) and hands each layer its type's;
- the embedding is scaled by sqrt(d_model) inside `embed_tokens` (Gemma3TextScaledWordEmbedding);
- multi-query attention (the 270M model: 4 query heads over 1 key/value head) with head_dim
  (256) set apart from d_model / n_heads.
Not read: `attn_logit_softcapping` (transformers' Gemma3Attention does not pass it to the
attention). Refused: `final_logit_softcapping` (headlens's metrics unembed with the LM head's
weight, which would skip the cap; no released Gemma 3 sets it) and bidirectional attention
(`use_bidirectional_attention`, the embedding variants: not a causal LM).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn
from transformers.models.gemma3 import modeling_gemma3

from headlens.arch.base import FULL, SLIDING, LayerContext, get_module
from headlens.arch.context import causal_masks
from headlens.arch.llama import LLAMA_SITES
from headlens.arch.mha import AttentionWeights
from headlens.arch.rotary import RotaryAdapter
from headlens.arch.sites import NORMED, Site, Split
from headlens.errors import UnsupportedModelError

GEMMA_NORM_OFFSET = 1.0  # Gemma3RMSNorm: x / rms(x) * (1 + weight)

# Llama's table with q and k read after the per-head norms, with their weights in q_proj and k_proj
# (q_norm sees q already split and transposed, [batch, heads, pos, d_head]: see split_heads), the
# norm before the MLP named `pre_feedforward_layernorm`, and Gemma's rotary function.
GEMMA3_SITES = replace(
    LLAMA_SITES,
    post_norm="pre_feedforward_layernorm",
    rotary=modeling_gemma3.apply_rotary_pos_emb,
    q=Site("self_attn.q_norm", split=Split(NORMED), weights="self_attn.q_proj"),
    k=Site("self_attn.k_norm", split=Split(NORMED, heads="n_kv_heads"), weights="self_attn.k_proj"),
)


@dataclass
class Gemma3Context(LayerContext):
    """LayerContext whose rotary cos/sin differ per layer (one pair per layer type)."""

    layer_extra: dict = field(default_factory=dict)  # layer -> its own keyword arguments where they differ from extra

    def attn_kwargs(self, copies: int = 1, layer: int | None = None) -> dict:
        return {**super().attn_kwargs(copies, layer), **self.layer_extra.get(layer, {})}


class Gemma3Adapter(RotaryAdapter):
    family = "gemma3_text"
    sites = GEMMA3_SITES
    attn_out_norm = "post_attention_layernorm"  # relative to a layer: the norm on the attention output
    mlp_out_norm = "post_feedforward_layernorm"  # relative to a layer: the norm on the MLP output

    def __init__(self, model):
        super().__init__(model)
        if getattr(self.config, "final_logit_softcapping", None) is not None:
            raise UnsupportedModelError(
                f"gemma3_text with final_logit_softcapping="
                f"{self.config.final_logit_softcapping} is not supported: headlens "
                f"unembeds with the LM head's weight alone"
            )
        if getattr(self.config, "use_bidirectional_attention", False):
            raise UnsupportedModelError(
                "gemma3_text with use_bidirectional_attention is not supported: headlens reads causal language models"
            )

    # Norm gains on a head's direct path (Gemma3RMSNorm multiplies by 1 + weight) ---------------
    def final_norm_gain(self) -> torch.Tensor:
        return GEMMA_NORM_OFFSET + self.final_norm().weight  # [d_model]

    def attn_out_gain(self, layer: int) -> torch.Tensor:
        return GEMMA_NORM_OFFSET + get_module(self.layer(layer), self.attn_out_norm).weight  # [d_model]

    def attn_out_norm_module(self, layer: int) -> nn.Module:
        return get_module(self.layer(layer), self.attn_out_norm)

    # Running one layer --------------------------------------------------------------------
    def context(self, input_ids: torch.Tensor, mask: torch.Tensor) -> Gemma3Context:
        """Masks as the base adapter builds them, and each layer its layer type's rotary cos/sin, as
        Gemma3TextModel.forward computes them: the rotary module takes the layer type
        (`rotary_emb(x, position_ids, layer_type)`), so the base adapter's one call cannot serve."""
        ids, mask, position_ids, embeds, full, layer_masks = causal_masks(self, input_ids, mask)
        types = self.layer_types()
        rotary = get_module(self.model, self.sites.rotary_emb)
        cos_sin = {kind: rotary(embeds, position_ids, kind) for kind in set(types)}  # 2 x [1, pos, d_head]
        # As with the masks: the global layers' cos/sin by default, a sliding layer's own where it differs
        default = cos_sin[FULL] if FULL in cos_sin else cos_sin[SLIDING]
        return Gemma3Context(
            ids,
            mask,
            position_ids,
            full,
            extra={"position_embeddings": default},
            layer_masks=layer_masks,
            layer_extra={
                layer: {"position_embeddings": cos_sin[kind]}
                for layer, kind in enumerate(types)
                if cos_sin[kind] is not default
            },
        )

    def finish_block(self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Gemma's sandwich: the attention and MLP outputs are normalised before each residual add."""
        block = self.layer(layer)
        mid = resid + get_module(block, self.attn_out_norm)(attn_out)  # [batch, pos, d_model]
        mlp, pre_mlp_norm = get_module(block, self.sites.mlp), get_module(block, self.sites.post_norm)
        mlp_out = mlp(pre_mlp_norm(mid))  # [batch, pos, d_model]
        return mid + get_module(block, self.mlp_out_norm)(mlp_out)  # [batch, pos, d_model]

    # Q, K, V ------------------------------------------------------------------------------
    def split_heads(self, tensor: torch.Tensor, site: Site) -> torch.Tensor:
        """q_norm and k_norm see q and k already split and transposed, [batch, heads, pos, d_head];
        v_proj's output is split by the table's rule."""
        if site.split.kind == NORMED:
            return tensor  # [batch, heads, pos, d_head]
        return super().split_heads(tensor, site)

    # Weights, for the from-scratch attention (headlens.arch.mha) ----------------------------------
    def rotary_tables(self, layer: int) -> tuple[torch.Tensor, float]:
        """The rotary frequencies [d_head / 2] and scaling of `layer`'s layer type (sliding or full)."""
        rotary, kind = get_module(self.model, self.sites.rotary_emb), self.layer_types()[layer]
        return getattr(rotary, f"{kind}_inv_freq"), float(getattr(rotary, f"{kind}_attention_scaling"))

    def attention_weights(self, layer: int) -> AttentionWeights:
        """RotaryAdapter's weights with Gemma's (1 + w) q/k norms and their epsilon."""
        return replace(
            super().attention_weights(layer), norm_eps=float(self.attn(layer).q_norm.eps), norm_offset=GEMMA_NORM_OFFSET
        )
