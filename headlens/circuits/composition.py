"""Q-, K- and V-composition from the weights (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits", transformer-circuits.pub/2021/framework).

A sender head s writes x W_OV^s into the residual stream (row vectors, TransformerLens's
convention: W_OV = W_V W_O, W_QK = W_Q W_K^T, both [d_model, d_model]). A later receiver r can
read that write with its queries, its keys or its values:
  Q: ||W_OV^s W_QK^r||_F    / (||W_OV^s||_F ||W_QK^r||_F)
  K: ||W_OV^s W_QK^r^T||_F  / (||W_OV^s||_F ||W_QK^r||_F)
  V: ||W_OV^s W_OV^r||_F    / (||W_OV^s||_F ||W_OV^r||_F)
(TransformerLens `all_composition_scores`). Weights are read through the site table
(`Adapter.qkv_weights`, `Adapter.w_o`) with what the model applies on the way folded in:
- the receiver's (and the sender's value's) input norm: its gain, read from the norm module
  itself as norm(x) - norm(0) on a probe of mean 0 and rms 1, and for LayerNorm its centring,
  which also centres every W_O (TransformerLens's fold_ln and center_writing_weights);
- per-head q and k norms (Qwen3, Gemma 3): their gain; the 1/rms of every norm is one scalar per
  position and drops out of the ratio;
- a norm on the attention output (Gemma 3): its gain on W_O;
- grouped / multi-query attention: a query head reads its key/value group's W_K and W_V.
Rotary positions rotate q and k by position and are left out, as in the paper's and
TransformerLens's scores. Biases are left out: the scores are properties of the linear maps.

Computation: ||A B||_F^2 = <A^T A, B B^T>_F, so every head gets one [d_model, d_model] Gram
matrix per role (sender: W_OV^T W_OV; receiver: W_QK W_QK^T, W_QK^T W_QK, W_OV W_OV^T), each made
through its [d_head, d_head] core, and all pairs are one matrix product per receiver layer.

What "high" means: random Gaussian matrices of the same shapes (W_V, W_Q, W_K [d_model, d_head],
W_O [d_head, d_model]) give scores whose mean and standard deviation are stated with every score
(`composition_baseline`, `composition_baseline_std`, `composition_z`); the three scores share one
distribution for independent Gaussian matrices, as all three are products of four of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from headlens.arch import adapter_for, get_module
from headlens.circuits.edges import VIAS, edge_frame
from headlens.heads import Head, all_heads
from headlens.load.devices import onloaded

BASELINE_SAMPLES = 256  # random weight sets the baseline's mean and spread are measured on
BASELINE_CHUNK = 64  # of them per batched QR


def norm_gain(norm: torch.nn.Module, size: int) -> torch.Tensor:
    """The gain [size] (float64) a gain-type norm (LayerNorm, RMSNorm, Gemma's (1 + w) RMSNorm)
    multiplies by: norm(x) - norm(0) at x = (1, -1, 1, -1, ...), whose mean is 0 and rms 1, times x.
    (Up to the scalar 1 / sqrt(1 + eps), which no ratio of norms sees.)"""
    weight = next(norm.parameters(), None)
    probe = torch.ones(1, size)  # [1, size]
    if weight is not None:
        probe = probe.to(weight.device, weight.dtype)
    probe[:, 1::2] = -1.0
    with torch.no_grad(), onloaded(norm):
        change = norm(probe) - norm(torch.zeros_like(probe))  # [1, size]
    return (change[0] * probe[0]).double().cpu()  # [size]


def head_weights(adapter, layer: int) -> dict[str, torch.Tensor]:
    """Every query head's effective W_Q, W_K, W_V [head, d_model, d_head] and W_O [head, d_head,
    d_model] of `layer` (float64, row-vector convention), norms folded in (module docstring)."""
    block, n_heads, d_head = adapter.layer(layer), adapter.n_heads, adapter.d_head
    norm = get_module(block, adapter.sites.input_norm)
    centre = isinstance(norm, torch.nn.LayerNorm)
    gain = norm_gain(norm, adapter.d_model)[:, None]  # [d_model, 1]
    groups = torch.tensor([adapter.kv_group(h) for h in range(n_heads)])  # [head]
    with onloaded(adapter.attn(layer)):
        rows = [w.detach().double().cpu() for w, _ in adapter.qkv_weights(layer)]  # [heads * d_head, d_model] each
        w_o = adapter.w_o(layer).detach().double().cpu()  # [head, d_head, d_model]
    out = {}
    for name, weight, norm_row in zip("qkv", rows, [*adapter.qk_norms(layer), None], strict=True):
        read = gain * weight.T  # [d_model, heads * d_head]: the input norm's gain folded in
        if centre:
            read = read - read.mean(0, keepdim=True)  # LayerNorm's centring folded in
        heads = read.view(adapter.d_model, -1, d_head).transpose(0, 1)  # [heads, d_model, d_head]
        if norm_row is not None:
            heads = heads * norm_gain(norm_row, d_head)  # a per-head q or k norm's gain
        out[name] = heads if name == "q" else heads[groups]  # [head, d_model, d_head]
    out_gain = adapter.attn_out_gain(layer)
    if out_gain is not None:
        w_o = w_o * out_gain.detach().double().cpu()  # [head, d_head, d_model]
    out["o"] = w_o - w_o.mean(-1, keepdim=True) if centre else w_o  # [head, d_head, d_model]
    return out


def _sandwich(outer: torch.Tensor, core: torch.Tensor, dtype) -> torch.Tensor:
    """outer @ core @ outer^T per head, flattened: [head, d_model * d_model]; outer [head, d_model, d_head]."""
    outer = outer.to(dtype)
    return (outer @ core.to(dtype) @ outer.transpose(1, 2)).flatten(1)  # [head, d_model^2]


def head_grams(w: dict[str, torch.Tensor], dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The Gram matrices of one layer's heads, each [head, d_model^2]: `send` = W_OV^T W_OV, and the
    receiver's `q` = W_QK W_QK^T, `k` = W_QK^T W_QK, `v` = W_OV W_OV^T; and the squared Frobenius
    norms `qk_sq`, `ov_sq` [head] (float64)."""
    q, k, v, o = w["q"], w["k"], w["v"], w["o"]  # [head, d_model, d_head] x 3, [head, d_head, d_model]
    gram = {name: t.transpose(1, 2) @ t for name, t in (("q", q), ("k", k), ("v", v))}  # [head, d_head, d_head]
    o_gram = o @ o.transpose(1, 2)  # [head, d_head, d_head]
    return {
        "send": _sandwich(o.transpose(1, 2), gram["v"], dtype),  # W_O^T (W_V^T W_V) W_O
        "q": _sandwich(q, gram["k"], dtype),  # W_Q (W_K^T W_K) W_Q^T
        "k": _sandwich(k, gram["q"], dtype),  # W_K (W_Q^T W_Q) W_K^T
        "v": _sandwich(v, o_gram, dtype),  # W_V (W_O W_O^T) W_V^T
        "qk_sq": (gram["q"] * gram["k"]).sum((1, 2)),  # [head] ||W_Q W_K^T||_F^2
        "ov_sq": (gram["v"] * o_gram).sum((1, 2)),  # [head] ||W_V W_O||_F^2
    }


def composition_tensor(model, dtype=torch.float32) -> torch.Tensor:
    """Scores of every (sender, receiver, via): [n_layers, n_heads, n_layers, n_heads, 3] (float64,
    q, k, v; NaN unless the sender's layer is earlier)."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    out = torch.full((n_layers, n_heads, n_layers, n_heads, 3), float("nan"), dtype=torch.float64)
    sends: list[torch.Tensor] = []  # per earlier layer: [head, d_model^2]
    ov_sq: list[torch.Tensor] = []  # per earlier layer: [head]
    for layer in range(n_layers):
        grams = head_grams(head_weights(adapter, layer), dtype)
        if sends:
            send = torch.cat(sends)  # [n_send, d_model^2]
            for index, via in enumerate(VIAS):
                top = (send @ grams[via].T).double().clamp_min(0.0)  # [n_send, head]: ||A B||_F^2
                recv_sq = grams["qk_sq"] if via != "v" else grams["ov_sq"]  # [head]
                score = (top / (torch.cat(ov_sq)[:, None] * recv_sq[None])).sqrt()  # [n_send, head]
                out[:layer, :, layer, :, index] = score.view(layer, n_heads, n_heads)
        sends.append(grams["send"])
        ov_sq.append(grams["ov_sq"])
    return out


def random_baseline(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of ||A B C D^T||_F / (||A B||_F ||C D^T||_F) for independent
    Gaussian A, C, D [d_model, d_head] and B [d_head, d_model] (any of the three scores of random
    heads of these shapes). With A = Q_A R_A and D = Q_D R_D (QR), every norm is of a [d_head,
    d_head] or [d_head, d_model] product: ||R_A (B C) R_D^T|| / (||R_A B|| ||C R_D^T||)."""
    gen = torch.Generator().manual_seed(seed)
    scores = []
    for start in range(0, samples, BASELINE_CHUNK):
        n = min(BASELINE_CHUNK, samples - start)
        a, c, d = (torch.randn(n, d_model, d_head, generator=gen, dtype=torch.float64) for _ in range(3))
        b = torch.randn(n, d_head, d_model, generator=gen, dtype=torch.float64)  # [n, d_head, d_model]
        r_a, r_d = torch.linalg.qr(a, mode="r")[1], torch.linalg.qr(d, mode="r")[1]  # [n, d_head, d_head]
        top = torch.linalg.matrix_norm(r_a @ (b @ c) @ r_d.transpose(1, 2))  # [n]
        scores.append(top / (torch.linalg.matrix_norm(r_a @ b) * torch.linalg.matrix_norm(c @ r_d.transpose(1, 2))))
    values = torch.cat(scores)  # [samples]
    return float(values.mean()), float(values.std())


def composition_scores(
    loaded,
    senders: Sequence[Head] | None = None,
    receivers: Sequence[Head] | None = None,
    seed: int = 0,
    samples: int = BASELINE_SAMPLES,
    dtype=torch.float32,
) -> pd.DataFrame:
    """Q-, K- and V-composition of every (sender, receiver) pair with the sender in an earlier
    layer (optionally only the heads given): an edge frame (headlens.circuits.edges) with
    `composition` and the random baseline's `composition_baseline` (mean),
    `composition_baseline_std` and `composition_z` = (score - mean) / std, sorted receiver-major
    as (receiver layer, receiver head, sender layer, sender head, via). `dtype` of the Gram
    products (float32: scores within ~1e-3 of float64 near 0, closer above)."""
    adapter = adapter_for(loaded.model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    scores = composition_tensor(loaded.model, dtype)  # [layer, head, layer, head, via]
    keep_send = _mask(senders, n_layers, n_heads)  # [layer, head]
    keep_recv = _mask(receivers, n_layers, n_heads)  # [layer, head]
    keep = ~scores[..., 0].isnan() & keep_send[:, :, None, None] & keep_recv[None, None]  # [layer, head, layer, head]
    by_receiver = keep.permute(2, 3, 0, 1)  # [recv layer, recv head, send layer, send head]
    rl, rh, sl, sh = (t.numpy() for t in by_receiver.nonzero(as_tuple=True))  # [n_pairs] each, receiver-major
    values = scores.permute(2, 3, 0, 1, 4)[by_receiver].numpy()  # [n_pairs, via]
    heads = all_heads(n_layers, n_heads)
    send = [heads[i] for i in np.repeat(sl * n_heads + sh, 3)]
    recv = [str(heads[i]) for i in np.repeat(rl * n_heads + rh, 3)]
    mean, std = random_baseline(adapter.d_model, adapter.d_head, samples, seed)
    flat = values.reshape(-1)  # [n_pairs * 3]
    return edge_frame(
        send,
        recv,
        list(VIAS) * len(values),
        composition=flat,
        composition_baseline=mean,
        composition_baseline_std=std,
        composition_z=(flat - mean) / std,
    )


def _mask(heads: Sequence[Head] | None, n_layers: int, n_heads: int) -> torch.Tensor:
    """[layer, head] bool: True at the heads given (all when None)."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    if heads is None:
        return ~mask
    for head in heads:
        mask[head.layer, head.head] = True
    return mask
