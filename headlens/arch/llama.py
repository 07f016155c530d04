"""Llama (`LlamaForCausalLM`: Llama 2/3, TinyLlama, SmolLM): RMSNorm, rotary positions, GQA.

Sites: `model.layers[L]` (input_layernorm -> self_attn (q_proj, k_proj, v_proj -> rotary ->
attention -> o_proj) -> + residual -> post_attention_layernorm -> mlp -> + residual),
`model.norm`, `lm_head`, `model.rotary_emb`. o_proj is an nn.Linear over the concatenated heads,
so W_O's columns are head-major: columns h*d_head..(h+1)*d_head read head h's z. Mistral and
Qwen2/Qwen3 derive their tables from this one (`llama_sites`).
"""

from __future__ import annotations

from dataclasses import replace

from transformers.models.llama import modeling_llama

from headlens.arch.rotary import RotaryAdapter
from headlens.arch.sites import INPUT, Site, Sites, Split

LLAMA_SITES = Sites(
    layers="model.layers",
    attn="self_attn",
    input_norm="input_layernorm",
    post_norm="post_attention_layernorm",
    mlp="mlp",
    q=Site("self_attn.q_proj"),
    k=Site("self_attn.k_proj", split=Split(heads="n_kv_heads")),
    v=Site("self_attn.v_proj", split=Split(heads="n_kv_heads")),
    z=Site("self_attn.o_proj", INPUT),
    o=Site("self_attn.o_proj"),
    embed="model.embed_tokens",
    final_norm="model.norm",
    unembed="lm_head",
    trunk="model",
    rotary_emb="model.rotary_emb",
    rotary=modeling_llama.apply_rotary_pos_emb,
)


def llama_sites(modeling, **changes) -> Sites:
    """Llama's table with the family's own rotary function (from its modeling module) and `changes`."""
    return replace(LLAMA_SITES, rotary=modeling.apply_rotary_pos_emb, **changes)


class LlamaAdapter(RotaryAdapter):
    family = "llama"
    sites = LLAMA_SITES
