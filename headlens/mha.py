"""Multi-head attention from scratch, torch only: the four moves, readable top to bottom.

Following nanoGPT (karpathy), module names copy GPT-2's checkpoint keys (`c_attn`, `c_proj`), so
loading a GPT-2 layer is a key-for-key copy plus one transpose: Hugging Face stores GPT-2's
projections as `Conv1D`, whose weight is [in, out], while `nn.Linear` holds [out, in].

The four moves (Vaswani et al. 2017, "Attention Is All You Need", section 3.2):
1) project the input to queries, keys and values and split each into heads (d_head = d_model / n_heads);
2) per head, pattern = softmax(Q K^T / sqrt(d_head)) under the causal mask;
3) z = pattern @ V per head, then concatenate the heads;
4) project the concatenation with W_O (`c_proj`) back to d_model.

`headlens.validate` feeds each layer's true input through this module and compares the result
with Hugging Face eager attention, torch's scaled_dot_product_attention and TransformerLens.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from headlens.errors import ConfigError


class AttentionOutput(NamedTuple):
    """What one attention layer computes, in TransformerLens vocabulary."""

    pattern: torch.Tensor  # [batch, head, q_pos, k_pos] post-softmax weights
    z: torch.Tensor  # [batch, pos, head, d_head] per-head outputs, the input of W_O
    attn_out: torch.Tensor  # [batch, pos, d_model] the layer's attention output (W_O z + b_O)


def gpt2_attention_scale(config, layer_idx: int) -> float:
    """The factor GPT-2 multiplies Q K^T by, honouring the config options that change it.

    `scale_attn_weights` (default True): divide by sqrt(d_head) (Vaswani et al. 2017). When False,
    no scaling. `scale_attn_by_inverse_layer_idx` (default False; Mistral's GPT-2 runs): also
    divide by layer_idx + 1. `reorder_and_upcast_attn` only changes the order of float operations
    (same math), and dropout is off in eval mode, so no other GPT-2 option changes attention.
    """
    d_head = config.n_embd // config.n_head
    scale = d_head**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        scale /= float(layer_idx + 1)
    return scale


class CausalSelfAttention(nn.Module):
    """GPT-2's causal multi-head self-attention; `forward` returns pattern, z and attn_out."""

    def __init__(self, d_model: int, n_heads: int, scale: float | None = None):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ConfigError(f"d_model {d_model} is not divisible by n_heads {n_heads}: d_head must be an integer")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.d_head)
        self.c_attn = nn.Linear(d_model, 3 * d_model)  # W_Q, W_K, W_V fused, as in the checkpoint
        self.c_proj = nn.Linear(d_model, d_model)  # W_O

    @classmethod
    def from_gpt2(cls, attn: nn.Module, config, layer_idx: int) -> CausalSelfAttention:
        """Copy the weights of a Hugging Face `GPT2Attention` (layer `layer_idx` of `config`).

        Conv1D computes x @ W + b with W [in, out]; nn.Linear computes x @ W^T + b with W
        [out, in]: hence the transposes.
        """
        d_model, n_heads = config.n_embd, config.n_head
        module = cls(d_model, n_heads, scale=gpt2_attention_scale(config, layer_idx))
        module = module.to(dtype=attn.c_attn.weight.dtype, device=attn.c_attn.weight.device)
        with torch.no_grad():
            module.c_attn.weight.copy_(attn.c_attn.weight.t())  # [d_model, 3 * d_model] -> [3 * d_model, d_model]
            module.c_attn.bias.copy_(attn.c_attn.bias)  # [3 * d_model]
            module.c_proj.weight.copy_(attn.c_proj.weight.t())  # [d_model, d_model] transposed
            module.c_proj.bias.copy_(attn.c_proj.bias)  # [d_model]
        return module.eval()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> AttentionOutput:
        """x: [batch, pos, d_model], the layer's input (GPT-2: the output of ln_1).

        attention_mask: optional [batch, pos] bool/0-1, True on real tokens; padded keys get no
        weight. A query with no visible key at all (left padding) gets an all-zero row.
        """
        batch, pos, d_model = x.shape
        # 1) project to Q, K, V and split into heads
        qkv = self.c_attn(x)  # [batch, pos, 3 * d_model]
        q, k, v = qkv.split(d_model, dim=-1)  # 3 x [batch, pos, d_model]
        q = q.view(batch, pos, self.n_heads, self.d_head).transpose(1, 2)  # [batch, head, q_pos, d_head]
        k = k.view(batch, pos, self.n_heads, self.d_head).transpose(1, 2)  # [batch, head, k_pos, d_head]
        v = v.view(batch, pos, self.n_heads, self.d_head).transpose(1, 2)  # [batch, head, k_pos, d_head]

        # 2) per head: softmax(Q K^T * scale) where the key is visible (causal, not padding)
        # [.., q_pos, d_head] @ [.., d_head, k_pos] -> [.., q_pos, k_pos]
        attn_scores = (q @ k.transpose(-2, -1)) * self.scale  # [batch, head, q_pos, k_pos]
        visible = torch.ones(pos, pos, dtype=torch.bool, device=x.device).tril()  # [q_pos, k_pos]
        visible = visible[None, None]  # [1, 1, q_pos, k_pos]
        if attention_mask is not None:
            visible = visible & attention_mask.bool()[:, None, None, :]  # [batch, 1, q_pos, k_pos]
        attn_scores = attn_scores.masked_fill(~visible, float("-inf"))  # [batch, head, q_pos, k_pos]
        pattern = torch.softmax(attn_scores, dim=-1)  # [batch, head, q_pos, k_pos]
        pattern = pattern.nan_to_num(0.0)  # rows with no visible key (all -inf) -> zeros

        # 3) weight the values, per head, and concatenate the heads
        z = (pattern @ v).transpose(1, 2)  # [.., q_pos, k_pos] @ [.., k_pos, d_head] -> [batch, pos, head, d_head]
        merged = z.reshape(batch, pos, d_model)  # [batch, pos, head * d_head]

        # 4) the output projection W_O (and its shared bias b_O)
        attn_out = self.c_proj(merged)  # [batch, pos, d_model]
        return AttentionOutput(pattern=pattern, z=z, attn_out=attn_out)


def pattern_rows(q: torch.Tensor, k: torch.Tensor, attention_mask: torch.Tensor, scale: float,
                 q_start: int, q_stop: int, window: int | None = None) -> torch.Tensor:
    """Rows q_start..q_stop-1 of the pattern from a layer's own queries and keys.

    Step 2 of the lesson on a block of queries, softmax in place: the one buffer made is the
    block's own [batch, head, q_stop - q_start, k_pos]. Keys stay full width so a row's key
    index is the key's position. q: [batch, head, pos, d_head]; k: [batch, kv_head, pos, d_head]
    (grouped-query attention: each key/value head serves head // kv_head consecutive query
    heads); attention_mask: [batch, pos] bool, True on real tokens; `window`: sliding-window
    attention, keys more than window - 1 positions back are masked.
    """
    pos = k.shape[2]
    rows = q_stop - q_start
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # [batch, head, k_pos, d_head]
    q = q[:, :, q_start:q_stop]  # [batch, head, rows, d_head]
    pattern = (q @ k.transpose(-2, -1)).mul_(scale)  # [batch, head, rows, k_pos], scores for now
    visible = torch.ones(rows, pos, dtype=torch.bool, device=q.device).tril(q_start)  # [rows, k_pos]
    if window is not None:
        visible &= ~torch.ones(rows, pos, dtype=torch.bool, device=q.device).tril(q_start - window)
    visible = visible[None, None] & attention_mask.bool()[:, None, None, :]  # [batch, 1, rows, k_pos]
    pattern.masked_fill_(~visible, float("-inf"))
    pattern.sub_(pattern.amax(-1, keepdim=True)).exp_()  # softmax, in place: shift, exp, normalise
    pattern.div_(pattern.sum(-1, keepdim=True))  # [batch, head, rows, k_pos]
    return pattern.nan_to_num_(0.0)  # rows with no visible key -> zeros
