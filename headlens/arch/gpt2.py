"""GPT-2 (`GPT2LMHeadModel`): learned absolute positions, LayerNorm, fused QKV in Conv1D.

Sites: `transformer.h[L]` (ln_1 -> attn (c_attn: q | k | v -> attention -> c_proj) -> + residual
-> ln_2 -> mlp -> + residual), `transformer.ln_f`, `lm_head`; the embedded input is
drop(wte(ids) + wpe(pos)). Conv1D computes x @ W + b with W [in, out], so W_O's rows are
head-major: rows h*d_head..(h+1)*d_head map head h's z. GPT2Config aliases n_head, n_embd and
n_positions to transformers' common names. No rotary positions, no grouped-query attention, no
sliding window; the from-scratch attention is the seeds' CausalSelfAttention.
"""

from __future__ import annotations

from headlens.arch.base import Adapter
from headlens.arch.mha import CausalSelfAttention, gpt2_attention_scale
from headlens.arch.sites import CONV1D, FUSED, INPUT, Site, Sites, Split


def _scratch(attn, config, layer: int) -> CausalSelfAttention:
    """The seeds' CausalSelfAttention with GPT-2's fused Conv1D weights copied in."""
    return CausalSelfAttention.from_gpt2(attn, config, layer)


def _qkv(part: int) -> Site:
    return Site("attn.c_attn", split=Split(FUSED, part=part, parts=3), layout=CONV1D)


GPT2_SITES = Sites(
    layers="transformer.h",
    attn="attn",
    input_norm="ln_1",
    post_norm="ln_2",
    mlp="mlp",
    q=_qkv(0),
    k=_qkv(1),
    v=_qkv(2),
    z=Site("attn.c_proj", INPUT, layout=CONV1D),
    o=Site("attn.c_proj", layout=CONV1D),
    embed="transformer.wte",
    pos_embed="transformer.wpe",
    embed_dropout="transformer.drop",
    final_norm="transformer.ln_f",
    unembed="lm_head",
    trunk="transformer",
    scale=gpt2_attention_scale,
    scratch=_scratch,
)


class GPT2Adapter(Adapter):
    family = "gpt2"
    sites = GPT2_SITES
