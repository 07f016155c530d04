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
through its [d_head, d_head] core and kept as its upper triangle (the Grams are symmetric), and all
pairs are one matrix product per receiver layer.

What "high" means: random Gaussian matrices of the same shapes (W_V, W_Q, W_K [d_model, d_head],
W_O [d_head, d_model]) give scores whose mean and standard deviation are stated with every score
(`composition_baseline`, `composition_baseline_std`, `composition_z`); the three scores share one
distribution for independent Gaussian matrices, as all three are products of four of them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from headlens.arch import adapter_for, get_module
from headlens.circuits.edges import VIAS, edge_frame
from headlens.heads import Head, all_heads
from headlens.load.devices import onloaded
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

BASELINE_SAMPLES = 256  # random weight sets the baseline's mean and spread are measured on
BASELINE_CHUNK = 64  # of them per batch


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


def _sandwich(outer: torch.Tensor, core: torch.Tensor, dtype, packed: torch.Tensor) -> torch.Tensor:
    """outer @ core @ outer^T per head, its upper triangle (diagonal included) packed: [head,
    n_packed]; outer [head, d_model, d_head], core [head, d_head, d_head], packed [n_packed] indexes
    the flattened [d_model, d_model] matrix."""
    outer = outer.to(dtype)
    full = (outer @ core.to(dtype)) @ outer.transpose(1, 2)  # [head, d_model, d_model]
    return full.flatten(1).index_select(1, packed)  # [head, n_packed]


def upper_index(d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat indexes of a [d_model, d_model] matrix's upper triangle, diagonal included
    [n_packed], and the weight each entry carries in a Frobenius product of two symmetric matrices
    (1 on the diagonal, 2 above it) [n_packed]."""
    rows, cols = torch.triu_indices(d_model, d_model)  # [n_packed] each
    return rows * d_model + cols, torch.where(rows == cols, 1.0, 2.0)


def head_grams(w: dict[str, torch.Tensor], dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The Gram matrices of one layer's heads, each packed to its upper triangle [head, n_packed]
    (`upper_index`): `send` = W_OV^T W_OV, and the receiver's `q` = W_QK W_QK^T, `k` = W_QK^T W_QK,
    `v` = W_OV W_OV^T; and the squared Frobenius norms `qk_sq`, `ov_sq` [head] (float64). All are
    symmetric, so <A, B>_F = sum over the packed entries of weight * A * B."""
    q, k, v, o = w["q"], w["k"], w["v"], w["o"]  # [head, d_model, d_head] x 3, [head, d_head, d_model]
    packed = upper_index(q.shape[1])[0]  # [n_packed]
    gram = {name: t.transpose(1, 2) @ t for name, t in (("q", q), ("k", k), ("v", v))}  # [head, d_head, d_head]
    o_gram = o @ o.transpose(1, 2)  # [head, d_head, d_head]
    return {
        "send": _sandwich(o.transpose(1, 2), gram["v"], dtype, packed),  # W_O^T (W_V^T W_V) W_O
        "q": _sandwich(q, gram["k"], dtype, packed),  # W_Q (W_K^T W_K) W_Q^T
        "k": _sandwich(k, gram["q"], dtype, packed),  # W_K (W_Q^T W_Q) W_K^T
        "v": _sandwich(v, o_gram, dtype, packed),  # W_V (W_O W_O^T) W_V^T
        "qk_sq": (gram["q"] * gram["k"]).sum((1, 2)),  # [head] ||W_Q W_K^T||_F^2
        "ov_sq": (gram["v"] * o_gram).sum((1, 2)),  # [head] ||W_V W_O||_F^2
    }


def composition_tensor(model, dtype=torch.float32) -> torch.Tensor:
    """Scores of every (sender, receiver, via): [n_layers, n_heads, n_layers, n_heads, 3] (float64,
    q, k, v; NaN unless the sender's layer is earlier). The earlier layers' sender Grams (weighted
    for the packed Frobenius product) fill one preallocated buffer, read as a view per layer."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    out = torch.full((n_layers, n_heads, n_layers, n_heads, 3), float("nan"), dtype=torch.float64)
    weight = upper_index(adapter.d_model)[1].to(dtype)  # [n_packed]
    sends = torch.empty(n_layers * n_heads, len(weight), dtype=dtype)  # [sender, n_packed]
    ov_sq = torch.empty(n_layers * n_heads, dtype=torch.float64)  # [sender]
    for layer in range(n_layers):
        grams = head_grams(head_weights(adapter, layer), dtype)
        done = layer * n_heads  # senders of the earlier layers
        if layer:
            for index, via in enumerate(VIAS):
                top = (sends[:done] @ grams[via].T).double().clamp_min(0.0)  # [n_send, head]: ||A B||_F^2
                recv_sq = grams["qk_sq"] if via != "v" else grams["ov_sq"]  # [head]
                score = (top / (ov_sq[:done, None] * recv_sq[None])).sqrt()  # [n_send, head]
                out[:layer, :, layer, :, index] = score.view(layer, n_heads, n_heads)
        sends[done : done + n_heads] = grams["send"] * weight
        ov_sq[done : done + n_heads] = grams["ov_sq"]
    return out


@functools.lru_cache(maxsize=8)
def random_baseline(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of ||A B C D^T||_F / (||A B||_F ||C D^T||_F) for independent
    Gaussian A, C, D [d_model, d_head] and B [d_head, d_model] (any of the three scores of random
    heads of these shapes). With A = Q_A R_A and D = Q_D R_D (QR), every norm is of a [d_head,
    d_head] or [d_head, d_model] product: ||R_A (B C) R_D^T|| / (||R_A B|| ||C R_D^T||). R_A and
    R_D are drawn directly (`gaussian_r`), without A and D. Cached: a pure function of its arguments."""
    rng = np.random.default_rng(seed)
    scores = []
    for start in range(0, samples, BASELINE_CHUNK):
        n = min(BASELINE_CHUNK, samples - start)
        r_a, r_d = gaussian_r(rng, n, d_model, d_head), gaussian_r(rng, n, d_model, d_head)  # [n, d_head, d_head]
        b = torch.from_numpy(rng.standard_normal((n, d_head, d_model)))  # [n, d_head, d_model]
        c = torch.from_numpy(rng.standard_normal((n, d_model, d_head)))  # [n, d_model, d_head]
        top = torch.linalg.matrix_norm(r_a @ (b @ c) @ r_d.transpose(1, 2))  # [n]
        scores.append(top / (torch.linalg.matrix_norm(r_a @ b) * torch.linalg.matrix_norm(c @ r_d.transpose(1, 2))))
    values = torch.cat(scores)  # [samples]
    return float(values.mean()), float(values.std())


def gaussian_r(rng: np.random.Generator, n: int, rows: int, cols: int) -> torch.Tensor:
    """n draws of the R factor of a Gaussian [rows, cols] matrix's QR (rows >= cols; signs chosen
    so its diagonal is positive), by the Bartlett decomposition of the Wishart matrix R^T R = A^T A:
    R[i, i]^2 ~ chi-square(rows - i), R[i, j] ~ N(0, 1) above the diagonal, all independent:
    [n, cols, cols] float64."""
    upper = torch.from_numpy(rng.standard_normal((n, cols, cols))).triu(1)  # [n, cols, cols]
    diag = torch.from_numpy(np.sqrt(rng.chisquare(rows - np.arange(cols), size=(n, cols))))  # [n, cols]
    return upper + torch.diag_embed(diag)


def composition_scores(
    loaded: LoadedModel,
    senders: Sequence[Head] | None = None,
    receivers: Sequence[Head] | None = None,
    seed: int = 0,
    samples: int = BASELINE_SAMPLES,
    dtype=torch.float32,
) -> Result:
    """Q-, K- and V-composition of every (sender, receiver) pair with the sender in an earlier
    layer (optionally only the heads given): a Result of kind "edges" (headlens.results) whose frame is an edge
    frame (headlens.circuits.edges) with
    `composition` and the random baseline's `composition_baseline` (mean),
    `composition_baseline_std` and `composition_z` = (score - mean) / std, sorted receiver-major
    as (receiver layer, receiver head, sender layer, sender head, via). `dtype` of the Gram
    products (float32: scores within ~1e-3 of float64 near 0, closer above). Its meta: `model`, `measure`
    ("composition"), the baseline's `baseline_mean`, `baseline_std`, `baseline_samples` and `seed`."""
    adapter = loaded.adapter
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
    frame = edge_frame(
        send,
        recv,
        list(VIAS) * len(values),
        composition=flat,
        composition_baseline=mean,
        composition_baseline_std=std,
        composition_z=(flat - mean) / std,
    )
    meta = {"model": str(loaded.name), "measure": "composition", "baseline_mean": mean, "baseline_std": std}
    return Result("edges", frame, {**meta, "baseline_samples": samples, "seed": seed})


def _mask(heads: Sequence[Head] | None, n_layers: int, n_heads: int) -> torch.Tensor:
    """[layer, head] bool: True at the heads given (all when None)."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    if heads is None:
        return ~mask
    for head in heads:
        mask[head.layer, head.head] = True
    return mask
