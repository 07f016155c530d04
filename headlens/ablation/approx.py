"""Every single-head ablation estimated from gradients, and its agreement with the exact sweep.

- `atp`: attribution patching (Nanda 2023; Syed et al. 2023, arXiv 2310.10348), one forward and
  one backward pass per batch;
- `atp*`: AtP* (Kramar et al. 2024, arXiv 2403.00745) at the z site: the QK fix for later heads'
  attention; its GradDrop score (unsigned, for ranking) is an extra column on request
  (all three in headlens.ablation.gradients).
`agreement` compares an estimate with exact deltas: Pearson, Spearman and the overlap of the ten
heads with the largest absolute change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from headlens.ablation.gradients import atp_star_deltas, attribution_deltas, graddrop_scores
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.intervene.evalset import BATCH_SIZE, build_evalset
from headlens.intervene.metrics import DIFFERENTIABLE, check_choice, is_loss
from headlens.intervene.replace import replacements
from headlens.intervene.sums import base_sums, sweep_sums
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

APPROX_METHODS = ("atp", "atp*")
TOP_K = 10  # heads compared by top10_overlap
SPOT_HEADS = 12  # heads ablated exactly by the spot check
SPOT_SEQS = BATCH_SIZE  # sequences of the spot check (the last ones of the evaluation set): one batch
ESTIMATES = {"atp": attribution_deltas, "atp*": atp_star_deltas}


def approx_sweep(
    loaded: LoadedModel,
    method: str = "zero",
    metric: str = "loss",
    text: str | None = None,
    seed: int = 0,
    approx: str = "atp",
    prompts: list[dict] | None = None,
    reference: str | None = None,
    bos: bool = True,
    graddrop: bool = False,
) -> Result:
    """Every single-head ablation delta estimated by `approx` (APPROX_METHODS). A Result of kind "approx"
    whose frame has `layer`, `head`, `n`, `delta_approx` (and `delta_loss_approx` for loss metrics), and
    with `graddrop` the unsigned GradDrop score (headlens.ablation.gradients), sorted by (layer, head); its
    meta holds `model`, `method`, `metric` and `approx`."""
    metric = check_choice(method, metric)
    if approx not in APPROX_METHODS:
        raise ConfigError(f"unknown --approx {approx!r}: choose one of {', '.join(APPROX_METHODS)}")
    if metric not in DIFFERENTIABLE:
        raise ConfigError(
            f"metric {metric} has no gradient (a top-1 hit): --approx needs one of {', '.join(DIFFERENTIABLE)}"
        )
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos)
    reps = replacements(loaded.model, evalset, method, seed, batch_size=BATCH_SIZE)
    deltas = ESTIMATES[approx](loaded.model, evalset, reps)  # [layer, head]
    dropped = graddrop_scores(loaded.model, evalset, reps) if graddrop else None  # [layer, head]
    rows = []
    for layer in range(deltas.shape[0]):
        for head in range(deltas.shape[1]):
            row = {"layer": layer, "head": head, "n": evalset.n_tokens, "delta_approx": float(deltas[layer, head])}
            if is_loss(metric):
                row["delta_loss_approx"] = row["delta_approx"]
            if dropped is not None:
                row["graddrop"] = float(dropped[layer, head])
            rows.append(row)
    meta = {"model": str(loaded.name), "method": method, "metric": metric, "approx": approx}
    return Result("approx", pd.DataFrame(rows), meta)


def agreement(exact: pd.DataFrame | Result, approx: pd.DataFrame | Result) -> dict:
    """Pearson and Spearman correlation of exact `delta` and `delta_approx` per head, and
    `top10_overlap`: the share of the exact top-k heads (by |delta|) that are also in the
    estimate's top k, k = min(10, n_heads // 4) so that a small model's overlap is not 1 by default.
    Why a top head is missed, measured on the exact top k: `top_under` heads whose estimate has
    the right sign but under half the exact size, `top_flipped` heads whose estimate has the
    wrong sign (a first-order estimate misses curvature and paths through later nonlinearities:
    Kramar et al. 2024, arXiv 2403.00745, Section 3). Either side may be a Result (its frame is read)."""
    exact, approx = _frame(exact), _frame(approx)
    merged = exact[["layer", "head", "delta"]].merge(approx[["layer", "head", "delta_approx"]], on=["layer", "head"])
    x, y = merged["delta"], merged["delta_approx"]
    k = min(TOP_K, max(1, len(merged) // 4))
    top_x = set(x.abs().nlargest(k).index)
    top_y = set(y.abs().nlargest(k).index)
    top = merged.loc[sorted(top_x)]
    same_sign = (top["delta"] * top["delta_approx"]) > 0
    return {
        "pearson": float(x.corr(y)),
        "spearman": float(x.rank().corr(y.rank())),
        "top10_overlap": len(top_x & top_y) / k if k else float("nan"),
        "top_k": k,
        "top_under": int((same_sign & (top["delta_approx"].abs() < top["delta"].abs() / 2)).sum()),
        "top_flipped": int((~same_sign).sum()),
        "n_heads": len(merged),
    }


def spot_check(
    loaded: LoadedModel,
    method: str = "zero",
    metric: str = "loss",
    text: str | None = None,
    seed: int = 0,
    approx: str = "atp",
    prompts: list[dict] | None = None,
    reference: str | None = None,
    bos: bool = True,
) -> Result:
    """How far `approx` can be trusted on this model, cheaply: on the last SPOT_SEQS sequences of
    the evaluation set, SPOT_HEADS heads drawn at random (seeded) are ablated exactly and compared
    with the estimate on the same sequences. A Result of kind "spot_check": its frame the heads drawn
    (`layer`, `head`, `delta`, `delta_approx`), its meta their `agreement` plus `n_seq`."""
    evalset = build_evalset(loaded, check_choice(method, metric), text, seed, prompts, reference, bos)
    n_seq = evalset.input_ids.shape[0]
    part = evalset.subset(slice(max(0, n_seq - SPOT_SEQS), n_seq))
    spec = loaded.spec
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randperm(spec.n_layers * spec.n_heads, generator=gen)[:SPOT_HEADS].tolist()
    heads = sorted(Head(i // spec.n_heads, i % spec.n_heads) for i in picks)
    reps = replacements(loaded.model, part, method, seed, batch_size=BATCH_SIZE)
    estimate = ESTIMATES[approx](loaded.model, part, reps)  # [layer, head]
    base = base_sums(loaded.model, part)  # [n_units]
    exact = {}
    sweep_sums(loaded.model, part, heads, reps, lambda h, s: exact.update({h: float((s - base).sum() / part.n_tokens)}))
    frame = pd.DataFrame(
        [
            {"layer": h.layer, "head": h.head, "delta": exact[h], "delta_approx": float(estimate[h.layer, h.head])}
            for h in heads
        ]
    )
    return Result("spot_check", frame, {**agreement(frame, frame), "n_seq": part.input_ids.shape[0]})


def _frame(table: pd.DataFrame | Result) -> pd.DataFrame:
    return table.frame if isinstance(table, Result) else table
