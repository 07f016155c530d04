"""GPT-2 (`GPT2LMHeadModel`): learned absolute positions, LayerNorm, fused QKV in Conv1D.

Sites: `transformer.h[L]` (ln_1 -> attn -> c_proj -> + residual -> ln_2 -> mlp -> + residual),
`transformer.ln_f`, `lm_head`. Conv1D computes x @ W + b with W [in, out], so W_O's rows are
head-major: rows h*d_head..(h+1)*d_head map head h's z.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask

from headlens.arch.base import Adapter, LayerContext, Sites
from headlens.mha import CausalSelfAttention, gpt2_attention_scale


class GPT2Adapter(Adapter):
    family = "gpt2"
    sites = Sites(layers="transformer.h", attn="attn", z="attn.c_proj", input_norm="ln_1", post_norm="ln_2",
                  mlp="mlp", embed="transformer.wte", final_norm="transformer.ln_f", unembed="lm_head",
                  trunk="transformer")

    @property
    def n_heads(self) -> int:
        return int(self.config.n_head)

    @property
    def d_model(self) -> int:
        return int(self.config.n_embd)

    @property
    def n_ctx(self) -> int:
        return int(self.config.n_positions)

    def w_o(self, layer: int) -> torch.Tensor:
        weight = self.z_module(layer).weight  # Conv1D: [head * d_head, d_model]
        return weight.view(self.n_heads, self.d_head, -1)  # [head, d_head, d_model] (a view)

    def attention_scale(self, layer: int) -> float:
        return gpt2_attention_scale(self.config, layer)

    def scratch_attention(self, layer: int) -> torch.nn.Module:
        """The seeds' CausalSelfAttention with GPT-2's fused Conv1D weights copied in."""
        return CausalSelfAttention.from_gpt2(self.attn(layer), self.config, layer)

    def hook_qkv(self, layer: int, fn) -> list:
        n_heads, d_model = self.n_heads, self.d_model

        def hook(module, args, output):
            batch, pos, _ = output.shape  # [batch, pos, 3 * d_model]
            q, k, v = output.detach().split(d_model, dim=-1)  # 3 x [batch, pos, d_model]
            fn(*(t.reshape(batch, pos, n_heads, -1).transpose(1, 2) for t in (q, k, v)))  # [batch, head, pos, d_head]

        return [self.attn(layer).c_attn.register_forward_hook(hook)]

    def context(self, input_ids: torch.Tensor, mask: torch.Tensor) -> LayerContext:
        device = next(self.model.parameters()).device
        ids, mask = input_ids.to(device), mask.to(device)  # [batch, pos]
        position_ids = torch.arange(ids.shape[1], device=device)[None]  # [1, pos]
        embeds = self.embed()(ids)  # [batch, pos, d_model]
        attn_mask = create_causal_mask(config=self.trunk().config, inputs_embeds=embeds, attention_mask=mask.long(),
                                       cache=None, position_ids=position_ids)  # [batch, 1, q_pos, k_pos] or None
        return LayerContext(ids, mask, position_ids, attn_mask, extra={})

    def embed_tokens(self, ctx: LayerContext) -> torch.Tensor:
        trunk = self.trunk()
        return trunk.drop(trunk.wte(ctx.input_ids) + trunk.wpe(ctx.position_ids))  # [batch, pos, d_model]
