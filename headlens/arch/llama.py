"""Llama (`LlamaForCausalLM`: Llama 2/3, TinyLlama, SmolLM): RMSNorm, rotary positions, GQA.

Sites: `model.layers[L]` (input_layernorm -> self_attn (q_proj, k_proj, v_proj -> rotary ->
attention -> o_proj) -> + residual -> post_attention_layernorm -> mlp -> + residual),
`model.norm`, `lm_head`. o_proj is an nn.Linear over the concatenated heads, so W_O's columns
are head-major: columns h*d_head..(h+1)*d_head read head h's z. Mistral and Qwen2/Qwen3 keep
these module names and differ only where their adapters say.
"""

from __future__ import annotations

from headlens.arch.base import Sites
from headlens.arch.rotary import RotaryAdapter


class LlamaAdapter(RotaryAdapter):
    family = "llama"
    sites = Sites(layers="model.layers", attn="self_attn", z="self_attn.o_proj", input_norm="input_layernorm",
                  post_norm="post_attention_layernorm", mlp="mlp", embed="model.embed_tokens",
                  final_norm="model.norm", unembed="lm_head", trunk="model")
