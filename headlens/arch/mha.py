"""Multi-head attention from scratch, torch only: the four moves, readable top to bottom.

Following nanoGPT (karpathy), module names copy GPT-2's checkpoint keys (`c_attn`, `c_proj`), so
loading a GPT-2 layer is a key-for-key copy plus one transpose: Hugging Face stores GPT-2's
projections as `Conv1D`, whose weight is [in, out], while `nn.Linear` holds [out, in].

The four moves (Vaswani et al. 2017, "Attention Is All You Need", section 3.2):
1) project the input to queries, keys and values and split each into heads (d_head = d_model / n_heads);
2) per head, pattern = softmax(Q K^T / sqrt(d_head)) under the causal mask;
3) z = pattern @ V per head, then concatenate the heads;
4) project the concatenation with W_O (`c_proj`) back to d_model.

`CausalSelfAttention` is GPT-2's attention. `GroupedQueryAttention` is the same four moves as
today's decoders run them (Llama, Mistral, Qwen, GPT-NeoX, Gemma 3), with module names copied from
Llama's checkpoint keys (`q_proj`, `k_proj`, `v_proj`, `o_proj`) and three additions inside move 1:
- grouped-query attention (Ainslie et al. 2023): n_kv_heads key/value heads, each shared by
  n_heads / n_kv_heads consecutive query heads (multi-query, Shazeer 2019: one for all), and
  d_head free of d_model / n_heads;
- an optional RMSNorm over each head's query and key (Qwen3; Gemma 3's multiplies by 1 + gain,
  `norm_offset` = 1);
- rotary positions (Su et al. 2021, "RoFormer"): each pair of dimensions (i, i + r/2) of the
  first r = rotary_dim dimensions of q and k is rotated by position x frequency (GPT-NeoX's
  `rotary_pct` < 1 leaves the rest unrotated), so q . k depends on the relative position; the
  frequencies are the layer's own (Gemma 3's sliding-window and global layers use different bases);
and, in move 2, an optional sliding window (Mistral): keys window or more positions back are masked.

`headlens.validate` feeds each layer's true input through these modules and compares the result
with Hugging Face eager attention, torch's scaled_dot_product_attention and TransformerLens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


def visible_keys(attention_mask: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Which key each query may attend to: [batch, 1, q_pos, k_pos] bool, True where k <= q, the key
    is a real token (attention_mask [batch, pos], True on real tokens) and, with a sliding window,
    k > q - window (transformers' `sliding_window_overlay`)."""
    pos = attention_mask.shape[1]
    visible = torch.ones(pos, pos, dtype=torch.bool, device=attention_mask.device).tril()  # [q_pos, k_pos]
    if window is not None:
        visible &= ~torch.ones(pos, pos, dtype=torch.bool, device=attention_mask.device).tril(-window)
    return visible[None, None] & attention_mask.bool()[:, None, None, :]  # [batch, 1, q_pos, k_pos]


def pattern_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    attention_mask: torch.Tensor,
    scale: float,
    q_start: int,
    q_stop: int,
    window: int | None = None,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows q_start..q_stop-1 of the pattern from a layer's own queries and keys.

    Step 2 of the lesson on a block of queries: scores, mask and softmax on the block's own
    [batch, head, q_stop - q_start, k_pos]. Keys stay full width so a row's key index is the key's
    position. q: [batch, head, pos, d_head]; k: [batch, kv_head, pos, d_head] (grouped-query
    attention: each key/value head serves head // kv_head consecutive query heads; a caller
    looping over blocks passes k already expanded to every query head); attention_mask: [batch,
    pos] bool, True on real tokens; `window`: sliding-window attention, keys window or more
    positions back are masked; `visible`: visible_keys(attention_mask, window), computed once by
    a caller looping over blocks (each block then costs a handful of tensor operations).
    """
    pos = k.shape[2]
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # [batch, head, k_pos, d_head]
    # Keys no row of the block can see (after its last query; before its first query's window)
    # get weight 0 without being scored: causal attention halves the work, a window cuts it more.
    lo = 0 if window is None else max(0, q_start - window + 1)
    hi = min(pos, q_stop)
    if visible is None:
        visible = torch.ones(q_stop - q_start, hi - lo, dtype=torch.bool, device=q.device).tril(q_start - lo)
        if window is not None:
            visible &= ~torch.ones(q_stop - q_start, hi - lo, dtype=torch.bool, device=q.device).tril(
                q_start - lo - window
            )
        visible = visible[None, None] & attention_mask.bool()[:, None, None, lo:hi]  # [batch, 1, rows, hi - lo]
    else:
        visible = visible[:, :, q_start:q_stop, lo:hi]  # [batch, 1, rows, hi - lo] (a view)
    scores = (q[:, :, q_start:q_stop] @ k[:, :, lo:hi].transpose(-2, -1)).mul_(scale)  # [batch, head, rows, hi - lo]
    scores.masked_fill_(~visible, float("-inf"))
    pattern = scores.new_empty(*scores.shape[:-1], pos)  # [batch, head, rows, k_pos]
    pattern[..., :lo].zero_()
    pattern[..., hi:].zero_()
    torch.softmax(scores, dim=-1, out=pattern[..., lo:hi])
    return pattern.nan_to_num_(0.0)  # rows with no visible key -> zeros


@dataclass
class AttentionWeights:
    """One decoder layer's attention, as `nn.Linear` keeps it ([out, in]); read by the adapters."""

    w_q: torch.Tensor  # [n_heads * d_head, d_model], rows head-major
    w_k: torch.Tensor  # [n_kv_heads * d_head, d_model]
    w_v: torch.Tensor  # [n_kv_heads * d_head, d_model]
    w_o: torch.Tensor  # [d_model, n_heads * d_head]
    b_q: torch.Tensor | None  # [n_heads * d_head] or None (likewise b_k, b_v; b_o [d_model])
    b_k: torch.Tensor | None
    b_v: torch.Tensor | None
    b_o: torch.Tensor | None
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (n_heads: plain multi-head attention)
    scale: float  # Q K^T is multiplied by this before the softmax
    inv_freq: torch.Tensor | None = None  # [rotary_dim / 2] rotary frequencies; None: no rotary
    rotary_scale: float = 1.0  # multiplies cos and sin (1 for plain RoPE; some rope variants rescale)
    q_norm: torch.Tensor | None = None  # [d_head] gain of the per-head RMSNorm on q (Qwen3), or None
    k_norm: torch.Tensor | None = None  # [d_head] the same for k
    norm_eps: float = 1e-6  # epsilon of those RMSNorms
    norm_offset: float = 0.0  # added to their gains: 1 for Gemma's RMSNorm, x * (1 + gain); 0 for Qwen3's
    window: int | None = None  # sliding window: keys >= window positions back are masked; None: full


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None).to(weight.dtype).to(weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gain over the last dimension, computed in float32 (Zhang & Sennrich 2019).

    With an offset (Gemma: 1) the gain is offset + gain and multiplies in float32 before the cast
    back to x's dtype, as Hugging Face's Gemma3RMSNorm rounds; without, the Llama/Qwen order."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., d]
    if offset:
        return (x32 * (offset + gain.float())).to(x.dtype)  # [..., d]
    return gain * x32.to(x.dtype)


def rotate(x: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Rotary positions on x [batch, head, pos, d_head]: dimensions i and i + r/2 (i < r/2, r =
    2 len(inv_freq)) are rotated by the angle pos * inv_freq[i] (the half-split pairing of GPT-NeoX
    and Hugging Face's Llama); dimensions r.. pass unchanged."""
    r = 2 * inv_freq.shape[0]
    positions = torch.arange(x.shape[2], device=x.device, dtype=torch.float32)  # [pos]
    angles = positions[:, None] * inv_freq.float()[None]  # [pos, r / 2]
    angles = torch.cat([angles, angles], dim=-1)  # [pos, r]
    cos, sin = (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)  # [pos, r]
    x_rot, x_pass = x[..., :r], x[..., r:]  # [batch, head, pos, r], [batch, head, pos, d_head - r]
    halves = torch.cat([-x_rot[..., r // 2 :], x_rot[..., : r // 2]], dim=-1)  # [batch, head, pos, r]
    return torch.cat([x_rot * cos + halves * sin, x_pass], dim=-1)  # [batch, head, pos, d_head]


class GroupedQueryAttention(nn.Module):
    """Causal attention with grouped key/value heads, rotary positions and optional q/k norms."""

    def __init__(self, weights: AttentionWeights):
        super().__init__()
        if weights.n_heads % weights.n_kv_heads:
            raise ConfigError(f"n_heads {weights.n_heads} is not a multiple of n_kv_heads {weights.n_kv_heads}")
        self.n_heads, self.n_kv_heads = weights.n_heads, weights.n_kv_heads
        self.d_head = weights.w_q.shape[0] // weights.n_heads
        self.scale, self.window = weights.scale, weights.window
        self.q_proj, self.k_proj = _linear(weights.w_q, weights.b_q), _linear(weights.w_k, weights.b_k)
        self.v_proj, self.o_proj = _linear(weights.w_v, weights.b_v), _linear(weights.w_o, weights.b_o)
        self.inv_freq, self.rotary_scale = weights.inv_freq, weights.rotary_scale
        self.q_norm, self.k_norm, self.norm_eps = weights.q_norm, weights.k_norm, weights.norm_eps
        self.norm_offset = weights.norm_offset

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> AttentionOutput:
        """x: [batch, pos, d_model], the layer's input (after its input norm); attention_mask as in
        CausalSelfAttention."""
        batch, pos, _ = x.shape
        # 1) project to Q, K, V and split into heads; q/k norm; rotary positions
        q = self.q_proj(x).view(batch, pos, self.n_heads, self.d_head)  # [batch, q_pos, head, d_head]
        k = self.k_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)  # [batch, k_pos, kv_head, d_head]
        v = self.v_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)  # [batch, k_pos, kv_head, d_head]
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, self.norm_eps, self.norm_offset)  # [batch, q_pos, head, d_head]
            k = rms_norm(k, self.k_norm, self.norm_eps, self.norm_offset)  # [batch, k_pos, kv_head, d_head]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head | kv_head, pos, d_head]
        if self.inv_freq is not None:
            q, k = rotate(q, self.inv_freq, self.rotary_scale), rotate(k, self.inv_freq, self.rotary_scale)
        group = self.n_heads // self.n_kv_heads  # each key/value head serves `group` consecutive query heads
        k = k.repeat_interleave(group, dim=1)  # [batch, head, k_pos, d_head]
        v = v.repeat_interleave(group, dim=1)  # [batch, head, k_pos, d_head]

        # 2) per head: softmax(Q K^T * scale) where the key is visible (causal, in the window, not padding)
        attn_scores = (q @ k.transpose(-2, -1)) * self.scale  # [batch, head, q_pos, k_pos]
        visible = torch.ones(pos, pos, dtype=torch.bool, device=x.device).tril()  # [q_pos, k_pos]
        if self.window is not None:
            visible &= ~torch.ones(pos, pos, dtype=torch.bool, device=x.device).tril(-self.window)
        visible = visible[None, None]  # [1, 1, q_pos, k_pos]
        if attention_mask is not None:
            visible = visible & attention_mask.bool()[:, None, None, :]  # [batch, 1, q_pos, k_pos]
        attn_scores = attn_scores.masked_fill(~visible, float("-inf"))  # [batch, head, q_pos, k_pos]
        pattern = torch.softmax(attn_scores, dim=-1).nan_to_num(0.0)  # [batch, head, q_pos, k_pos]

        # 3) weight the values, per head, and concatenate the heads
        z = (pattern @ v).transpose(1, 2)  # [batch, pos, head, d_head]
        merged = z.reshape(batch, pos, self.n_heads * self.d_head)  # [batch, pos, head * d_head]

        # 4) the output projection W_O (and its shared bias b_O)
        return AttentionOutput(pattern=pattern, z=z, attn_out=self.o_proj(merged))  # attn_out [batch, pos, d_model]
