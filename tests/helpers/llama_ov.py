"""The OV circuit W_U W_OV W_EE of a Llama model written out from its weights (RMSNorm, SwiGLU MLP0,
grouped values, o_proj, final-norm gain, lm_head): the independent computation the head-kind tests
check headlens.scores.ov_circuit against on SmolLM2."""

from __future__ import annotations

import os

import pytest
import torch

# float32 weights through a few matmuls of width 576-1536: logits agree to ~1e-4 of their spread
REL_TOL = 1e-4


def load_smollm2():
    """The pulled SmolLM2 (`make models`) as a LoadedModel; a skip where it is not pulled, a failure
    under CI=true (as tests/conftest.py's `pulled`)."""
    from headlens.errors import NotPulledError
    from headlens.load.models import load_model

    try:
        return load_model("smollm2")
    except NotPulledError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))


def _rms(x, norm):
    return norm.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


def manual_ov_logits(model, tokens, columns, layer):
    """W_U W_OV W_EE for one layer of a LlamaForCausalLM, written out: [head, n, c] (float64)."""
    inner = model.model
    x = inner.embed_tokens.weight[tokens].double()  # [n, d_model]
    block0 = inner.layers[0]
    post = block0.post_attention_layernorm
    h = _rms(x, post).to(torch.float32)
    mlp = block0.mlp
    x = x + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h)).double()  # [n, d_model]
    attn = inner.layers[layer].self_attn
    normed = _rms(x, inner.layers[layer].input_layernorm).double()  # [n, d_model]
    cfg = model.config
    d_head = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    v = (normed @ attn.v_proj.weight.double().T).view(len(tokens), -1, d_head)  # [n, kv, d_head] (no bias)
    w_o = attn.o_proj.weight.double().T.view(cfg.num_attention_heads, d_head, -1)  # [head, d_head, d_model]
    w_u = (model.lm_head.weight.double() * inner.norm.weight.double())[columns].T  # [d_model, c]
    return torch.stack([v[:, hd // group] @ w_o[hd] @ w_u for hd in range(cfg.num_attention_heads)])


def rms64(x, norm):
    """RMSNorm in float64: norm.weight * x / sqrt(mean(x^2) + eps)."""
    x = x.double()
    return norm.weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)


def manual_w_ee(model, tokens):
    """W_EE = x + attn0(x) + MLP0(...) of a Llama-type model, every layer-0 head attending to the token
    itself (McDougall et al.'s effective embedding), from the raw weights in float64: [n, d_model]."""
    cfg, block = model.config, model.model.layers[0]
    d_head, group = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    x = model.model.embed_tokens.weight[tokens].double()  # [n, d_model]
    v = (rms64(x, block.input_layernorm) @ block.self_attn.v_proj.weight.double().T).view(len(tokens), -1, d_head)
    z = v.repeat_interleave(group, dim=1).flatten(1)  # [n, heads * d_head]: each query head's value
    mid = x + z @ block.self_attn.o_proj.weight.double().T  # [n, d_model]
    h = rms64(mid, block.post_attention_layernorm).float()
    mlp = block.mlp
    return mid + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h)).double()


def manual_below(model, tokens, layer, head):
    """How many vocabulary logits lie below each token's own in its column: [n] (float64 throughout)."""
    cfg, inner = model.config, model.model
    d_head, group = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    attn = inner.layers[layer].self_attn
    normed = rms64(manual_w_ee(model, tokens), inner.layers[layer].input_layernorm)  # [n, d_model]
    kv = head // group
    v = normed @ attn.v_proj.weight.double()[kv * d_head : (kv + 1) * d_head].T  # [n, d_head]
    out = v @ attn.o_proj.weight.double()[:, head * d_head : (head + 1) * d_head].T  # [n, d_model]
    logits = out @ (model.lm_head.weight.double() * inner.norm.weight.double()).T  # [n, d_vocab]
    own = logits.gather(-1, tokens[:, None])  # [n, 1]
    return (logits < own).sum(-1)  # [n]
