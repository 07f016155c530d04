"""Every single-head ablation estimated from gradients, and its agreement with the exact sweep.

- `atp`: attribution patching (Nanda 2023; Syed et al. 2023, arXiv 2310.10348), one forward and
  one backward pass per batch (headlens.ablation.attribution.attribution_deltas);
- `atp*`: AtP* (Kramar et al. 2024, arXiv 2403.00745) at the z site
  (headlens.ablation.atp_star): the QK fix for later heads' attention and GradDrop.
`agreement` compares an estimate with exact deltas: Pearson, Spearman and the overlap of the ten
heads with the largest absolute change.
"""

from __future__ import annotations

import pandas as pd

from headlens.ablation.atp_star import atp_star_deltas
from headlens.ablation.attribution import attribution_deltas
from headlens.ablation.datasets import build_evalset
from headlens.ablation.metrics import DIFFERENTIABLE, check_choice, is_loss
from headlens.ablation.replace import replacements
from headlens.errors import ConfigError

APPROX_METHODS = ("atp", "atp*")
TOP_K = 10  # heads compared by top10_overlap


def approx_sweep(loaded, method: str = "zero", metric: str = "loss", text: str | None = None, seed: int = 0,
                 approx: str = "atp*", prompts: list[dict] | None = None, reference: str | None = None,
                 bos: bool = True) -> pd.DataFrame:
    """Every single-head ablation delta estimated by `approx` (APPROX_METHODS). DataFrame:
    `layer`, `head`, `n`, `delta_approx` (and `delta_loss_approx` for loss metrics), sorted by
    (layer, head)."""
    metric = check_choice(method, metric)
    if approx not in APPROX_METHODS:
        raise ConfigError(f"unknown --approx {approx!r}: choose one of {', '.join(APPROX_METHODS)}")
    if metric not in DIFFERENTIABLE:
        raise ConfigError(f"metric {metric} has no gradient (a top-1 hit): --approx needs one of "
                          f"{', '.join(DIFFERENTIABLE)}")
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos)
    reps = replacements(loaded.model, evalset, method, seed, batch_size=4)
    estimate = attribution_deltas if approx == "atp" else atp_star_deltas
    deltas = estimate(loaded.model, evalset, reps)  # [layer, head]
    rows = []
    for layer in range(deltas.shape[0]):
        for head in range(deltas.shape[1]):
            row = {"layer": layer, "head": head, "n": evalset.n_tokens, "delta_approx": float(deltas[layer, head])}
            if is_loss(metric):
                row["delta_loss_approx"] = row["delta_approx"]
            rows.append(row)
    return pd.DataFrame(rows)


def agreement(exact: pd.DataFrame, approx: pd.DataFrame) -> dict:
    """Pearson and Spearman correlation of exact `delta` and `delta_approx` per head, and
    `top10_overlap`: the share of the exact top-k heads (by |delta|) that are also in the
    estimate's top k, k = min(10, n_heads // 4) so that a small model's overlap is not 1 by default."""
    merged = exact[["layer", "head", "delta"]].merge(approx[["layer", "head", "delta_approx"]],
                                                      on=["layer", "head"])
    x, y = merged["delta"], merged["delta_approx"]
    k = min(TOP_K, max(1, len(merged) // 4))
    top_x = set(x.abs().nlargest(k).index)
    top_y = set(y.abs().nlargest(k).index)
    return {"pearson": float(x.corr(y)), "spearman": float(x.rank().corr(y.rank())),
            "top10_overlap": len(top_x & top_y) / k if k else float("nan"), "top_k": k, "n_heads": len(merged)}
