"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia): LayerNorm, partial rotary, fused QKV, parallel residual.

Sites: `gpt_neox.layers[L]`: attention(input_layernorm(x)) with a fused `query_key_value`
whose output is laid out per head, [batch, pos, head, (q | k | v) x d_head], the first
`rotary_pct` of each head's q and k rotated, then `dense` (W_O, an nn.Linear: columns
head-major); with `use_parallel_residual` (Pythia) the MLP reads the block's input,
x + attn(ln1(x)) + mlp(ln2(x)), else x' = x + attn(ln1(x)), x' + mlp(ln2(x')).
`gpt_neox.final_layer_norm`, `lm_head` (checkpoints' `embed_out`, renamed on load).
No grouped-query attention (the config has no num_key_value_heads: n_kv_heads = n_heads) and no
head_dim (d_head = d_model / n_heads).
"""

from __future__ import annotations

from transformers.models.gpt_neox import modeling_gpt_neox

from headlens.arch.rotary import RotaryAdapter
from headlens.arch.sites import FUSED_HEADS, INPUT, Site, Sites, Split


def _qkv(part: int) -> Site:
    return Site("attention.query_key_value", split=Split(FUSED_HEADS, part=part, parts=3))


NEOX_SITES = Sites(
    layers="gpt_neox.layers",
    attn="attention",
    input_norm="input_layernorm",
    post_norm="post_attention_layernorm",
    mlp="mlp",
    q=_qkv(0),
    k=_qkv(1),
    v=_qkv(2),
    z=Site("attention.dense", INPUT),
    o=Site("attention.dense"),
    embed="gpt_neox.embed_in",
    final_norm="gpt_neox.final_layer_norm",
    unembed="lm_head",
    trunk="gpt_neox",
    rotary_emb="gpt_neox.rotary_emb",
    rotary=modeling_gpt_neox.apply_rotary_pos_emb,
    parallel_residual="use_parallel_residual",
)


class NeoXAdapter(RotaryAdapter):
    family = "gpt_neox"
    sites = NEOX_SITES
