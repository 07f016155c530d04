"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia): LayerNorm, partial rotary, fused QKV, parallel residual.

Sites: `gpt_neox.layers[L]`: attention(input_layernorm(x)) with a fused `query_key_value`
whose output is laid out per head, [batch, pos, head, (q | k | v) x d_head], the first
`rotary_pct` of each head's q and k rotated, then `dense` (W_O, an nn.Linear: columns
head-major); with `use_parallel_residual` (Pythia) the MLP reads the block's input,
x + attn(ln1(x)) + mlp(ln2(x)), else x' = x + attn(ln1(x)), x' + mlp(ln2(x')).
`gpt_neox.final_layer_norm`, `lm_head` (checkpoints' `embed_out`, renamed on load).
No grouped-query attention: n_kv_heads = n_heads.
"""

from __future__ import annotations

import torch

from headlens.arch.base import Sites
from headlens.arch.rotary import RotaryAdapter


class NeoXAdapter(RotaryAdapter):
    family = "gpt_neox"
    sites = Sites(layers="gpt_neox.layers", attn="attention", z="attention.dense", input_norm="input_layernorm",
                  post_norm="post_attention_layernorm", mlp="mlp", embed="gpt_neox.embed_in",
                  final_norm="gpt_neox.final_layer_norm", unembed="lm_head", trunk="gpt_neox")
    qkv_sites = ("query_key_value",)

    def __init__(self, model):
        super().__init__(model)
        self.parallel_residual = bool(getattr(self.config, "use_parallel_residual", True))

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def split_qkv(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        fused = outputs[0]  # [batch, pos, 3 * d_model], per head (q | k | v)
        per_head = fused.view(*fused.shape[:-1], self.n_heads, 3 * self.d_head)  # [batch, pos, head, 3 * d_head]
        per_head = per_head.transpose(1, 2)  # [batch, head, pos, 3 * d_head]
        return per_head.chunk(3, dim=-1)  # 3 x [batch, head, pos, d_head]

    def qkv_weights(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        fused = self.attn(layer).query_key_value
        weight = fused.weight.view(self.n_heads, 3, self.d_head, self.d_model)  # [head, q|k|v, d_head, d_model]
        bias = None if fused.bias is None else fused.bias.view(self.n_heads, 3, self.d_head)  # [head, q|k|v, d_head]
        return [(weight[:, i].reshape(-1, self.d_model),  # [head * d_head, d_model]
                 None if bias is None else bias[:, i].reshape(-1)) for i in range(3)]
