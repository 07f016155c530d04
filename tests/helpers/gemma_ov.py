"""The OV circuit W_U W_OV W_EE of a Gemma 3 model written out from its Hugging Face modules: the
independent computation the head-kind tests check headlens.scores.ov_circuit against on Gemma 3.

Gemma 3 differs from Llama on the direct path: every RMSNorm multiplies by (1 + w), the embedding is
scaled by sqrt(d_model), the MLP sits between a pre- and a post-feedforward norm, and a norm on the
attention output (post_attention_layernorm) stands between o_proj and the residual add. That norm's
1/rms is one positive factor for all of a token's logits (it changes no rank), so the circuit here
keeps its gain (1 + w) and leaves the factor out."""

from __future__ import annotations

import torch

# float32 weights through a few matmuls of width 640-2048 (the 270M model): logits agree to ~1e-4 of their spread
REL_TOL = 1e-4


def _gemma_rms(x: torch.Tensor, norm) -> torch.Tensor:
    """Gemma3RMSNorm in float64: x / rms(x) * (1 + w)."""
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * (1 + norm.weight.double())


def manual_gemma_ov_logits(model, tokens: torch.Tensor, columns: torch.Tensor, layer: int) -> torch.Tensor:
    """W_U W_OV W_EE for one layer of a Gemma3ForCausalLM, written out in float64: [head, n, c]."""
    inner, cfg = model.model, model.config
    x = inner.embed_tokens.weight[tokens].double() * cfg.hidden_size**0.5  # [n, d_model]
    block0 = inner.layers[0]
    mlp = block0.mlp
    h = _gemma_rms(x, block0.pre_feedforward_layernorm).float()  # [n, d_model]: layer 0's attention left out
    act = torch.nn.functional.gelu(mlp.gate_proj(h), approximate="tanh") * mlp.up_proj(h)  # [n, d_ff]
    x = x + _gemma_rms(mlp.down_proj(act), block0.post_feedforward_layernorm)  # [n, d_model]
    block = inner.layers[layer]
    normed = _gemma_rms(x, block.input_layernorm)  # [n, d_model]
    d_head, group = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
    v = (normed @ block.self_attn.v_proj.weight.double().T).view(len(tokens), -1, d_head)  # [n, kv, d_head]
    w_o = block.self_attn.o_proj.weight.double().T.view(cfg.num_attention_heads, d_head, -1)  # [head, d_head, d_model]
    w_o = w_o * (1 + block.post_attention_layernorm.weight.double())  # the attention-output norm's gain
    w_u = (model.lm_head.weight.double() * (1 + inner.norm.weight.double()))[columns].T  # [d_model, c]
    return torch.stack([v[:, hd // group] @ w_o[hd] @ w_u for hd in range(cfg.num_attention_heads)])
