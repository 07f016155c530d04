"""Pruning curves: remove heads by increasing importance, measure the exact loss each step.

Michel et al. 2019, "Are Sixteen Heads Really Better than One?" (arXiv 1905.10650): head
importance |dL/d xi_h| through a gate on each head, normalised per layer (L2); heads pruned
iteratively in steps of 10% of all heads, by increasing importance, with importance recomputed
after each step; they removed 20% (WMT) / 40% (BERT) of heads without noticeable loss.
Here importance is measured on the reference windows and the loss on the evaluation windows
of the text (headlens.ablation.evalset: even windows evaluate, odd windows are the reference).
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens.ablation.ablate import ablated_sums
from headlens.ablation.attribution import head_importance, normalize_by_layer
from headlens.ablation.evalset import EvalSet, text_evalset
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head, format_heads

PRUNE_TOLERANCE = 0.05  # "how many heads can go within +5% loss"


def _reference_as_eval(evalset):

    if evalset.reference_ids is None:
        raise InputTextError("the text gives a single window: pruning needs a second window to measure "
                             "importance on (give a longer --text)")
    ref_mask = evalset.reference_mask
    counted = ref_mask[:, 1:] & ref_mask[:, :-1]  # [n_ref, pos-1]
    return EvalSet(evalset.reference_ids, ref_mask, counted, None, None, "text", evalset.data_hash)


def prune_curve(loaded, text: str | None = None, step_fraction: float = 0.1, seed: int = 0,
                progress: bool = False):
    """The pruning curve: columns `step`, `n_removed`, `fraction_removed`, `heads_removed`
    ("L.H,..." removed so far), `loss` (exact mean next-token loss with them zero-ablated).

    Step 0 removes nothing; each step zero-ablates round(step_fraction * n_heads) (at least 1)
    least important remaining heads, until every head is gone. `seed` is recorded
    for the API's symmetry: text windows and gradients are deterministic.
    """


    if not 0 < step_fraction <= 1:
        raise ConfigError(f"step_fraction {step_fraction} is out of range: give a value in (0, 1]")
    spec = loaded.spec
    model = loaded.model
    evalset = text_evalset(loaded, text)
    importance_set = _reference_as_eval(evalset)
    n_total = spec.n_layers * spec.n_heads
    per_step = max(1, round(step_fraction * n_total))
    keep = torch.ones(spec.n_layers, spec.n_heads, dtype=torch.bool)  # [layer, head]
    zero = [None] * spec.n_layers
    removed: list[Head] = []
    rows = []
    bar = _bar(math.ceil(n_total / per_step) + 1, progress)
    for step in range(math.ceil(n_total / per_step) + 1):
        if step > 0:
            scores = normalize_by_layer(head_importance(model, importance_set, keep), keep)  # [layer, head]
            scores = scores.masked_fill(~keep, math.inf).flatten()  # [layer * head]
            order = torch.argsort(scores, stable=True)[: min(per_step, int(keep.sum()))]
            for flat in order.tolist():
                keep[flat // spec.n_heads, flat % spec.n_heads] = False
                removed.append(Head(flat // spec.n_heads, flat % spec.n_heads))
        sums = ablated_sums(model, evalset, sorted(removed), zero)  # [n_seq]
        rows.append({"step": step, "n_removed": len(removed), "fraction_removed": len(removed) / n_total,
                     "heads_removed": format_heads(sorted(removed)),
                     "loss": float(sums.double().sum() / evalset.n_tokens)})
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return pd.DataFrame(rows)


def heads_within(curve, tolerance: float = PRUNE_TOLERANCE) -> int:
    """How many heads can go before the loss first exceeds (1 + tolerance) x the unpruned loss."""
    limit = curve["loss"].iloc[0] * (1 + tolerance)
    n = 0
    for row in curve.itertuples():
        if row.loss > limit:
            break
        n = row.n_removed
    return int(n)


def _bar(total: int, progress: bool):
    if not progress:
        return None

    return tqdm(total=total, desc="prune", unit="step", leave=False)
