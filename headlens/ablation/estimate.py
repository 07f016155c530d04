"""How long a sweep will take, said before it starts: its matmul FLOPs over this machine's rate now.

The single-head sweep (headlens.intervene.sums) walks the model once (every layer, every token),
runs the clean model once unless its run is cached (headlens.intervene.clean), and per head runs
its layer's MLP and every later block, then the unembedding of the scored positions. Per token a
block costs 2 FLOPs per weight plus attention's 4 x (mean sequence length) x (heads x d_head); the
rate is the best of a few float32 matmuls of a block's shape, timed here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from headlens.heads import Head

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel


def block_weights(loaded: LoadedModel) -> int:
    """Weights of one transformer block: the model's parameters less its embedding and unembedding."""
    model = loaded.model
    embed = model.get_input_embeddings().weight
    unembed = model.get_output_embeddings().weight
    outside = embed.numel() + (0 if unembed.data_ptr() == embed.data_ptr() else unembed.numel())
    return max(1, (loaded.spec.n_params - outside) // loaded.spec.n_layers)


def sweep_flops(loaded: LoadedModel, evalset, heads: list[Head], cached: bool) -> float:
    """Matmul FLOPs of sweeping `heads` on `evalset` (the clean run included unless `cached`)."""
    spec = loaded.spec
    tokens = int(evalset.mask.sum())
    mean_len = tokens / max(1, evalset.mask.shape[0])
    per_block = tokens * (2 * block_weights(loaded) + 4 * mean_len * spec.n_heads * spec.d_head)
    unembed = evalset.n_tokens * 2 * spec.d_model * spec.d_vocab
    total = spec.n_layers * per_block + (0 if cached else spec.n_layers * per_block + unembed)
    return total + sum((spec.n_layers - h.layer) * per_block + unembed for h in heads)


def matmul_rate(loaded: LoadedModel, rows: int = 512, repeats: int = 3) -> float:
    """FLOP/s of a [rows, d_model] x [d_model, 4 d_model] float32 matmul on this machine now (best of `repeats`)."""
    d_model = loaded.spec.d_model
    a, b = torch.randn(rows, d_model), torch.randn(d_model, 4 * d_model)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * d_model * 4 * d_model / max(best, 1e-9)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def sweep_estimate(loaded: LoadedModel, evalset, heads: list[Head], cached: bool) -> str:
    """One line: the sweep's heads, tokens and FLOPs, and the time they take at the rate measured now."""
    flops = sweep_flops(loaded, evalset, heads, cached)
    rate = matmul_rate(loaded)
    clean = "clean run cached" if cached else "clean run first, then cached"
    return (
        f"headlens: sweep of {len(heads)} heads on {int(evalset.mask.sum()):,} tokens ({clean}): "
        f"{flops / 1e12:.1f} TFLOP, about {duration(flops / rate)} at the {rate / 1e9:.0f} GFLOP/s measured now"
    )
