"""Pruning curves: remove heads by increasing importance, measure the exact loss each step.

Michel et al. 2019, "Are Sixteen Heads Really Better than One?" (arXiv 1905.10650): head
importance |dL/d xi_h| through a gate on each head, normalised per layer (L2); heads pruned
iteratively in steps of 10% of all heads, by increasing importance, with importance recomputed
after each step; they removed 20% (WMT) / 40% (BERT) of heads without noticeable loss.
Here the text's windows alternate: importance is measured on the odd windows and the loss on
the even ones, so the heads are not chosen on the data that scores them.

Against roles (Voita et al. 2019: the specialised heads are the last to be pruned):
`removal_by_role` compares the mean removal rank of labelled and unlabelled heads, with a
one-sided permutation p-value for "labelled heads are removed later".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.ablation.gradients import head_importance, normalize_by_layer
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head, format_heads
from headlens.intervene.evalset import BATCH_SIZE, EvalSet
from headlens.intervene.evalspec import EvalSpec
from headlens.intervene.sums import ablated_sums
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

PRUNE_TOLERANCE = 0.05  # "how many heads can go within +5% loss"
N_PERMUTATIONS = 10_000  # label shuffles of the removal-order test


def _split(evalset: EvalSet, part: int) -> EvalSet:
    """Every other window (part 0: even, 1: odd) as its own loss set, one bootstrap unit per window."""
    rows = slice(part, None, 2)
    ids, mask, counted = evalset.input_ids[rows], evalset.mask[rows], evalset.counted[rows]
    units = torch.where(counted, torch.arange(ids.shape[0])[:, None], torch.tensor(-1))  # [n_seq, pos-1]
    return EvalSet(
        ids,
        mask,
        counted,
        "loss",
        evalset.data_hash,
        f"windows {part}, {part + 2}, ... of the text",
        units=units,
        unit_label=f"{ids.shape[0]} windows",
    )


def prune_curve(
    loaded: LoadedModel,
    text: str | None = None,
    step_fraction: float = 0.1,
    progress: bool = False,
    labels: dict | None = None,
    batch_size: int = BATCH_SIZE,
    evaluation: EvalSpec | None = None,
) -> Result:
    """The pruning curve, a Result of kind "pruning" (headlens.results). Its frame: columns `step`,
    `n_removed`, `fraction_removed`, `heads_removed`
    ("L.H,..." removed so far), `step_heads` (removed at this step, least important first),
    `loss` (exact mean next-token loss with the removed heads zero-ablated) and, with `labels`
    (Head -> list of labels), `step_labelled` ("L.H:label;..." of this step's labelled heads). Its meta:
    `model`, `data` (the loss windows, in words) and `tokens` (the token budget).

    The windows are those of `evaluation` (an EvalSpec of the loss metric; default: `text` at the
    default token budget, evalspec.DEFAULT_TOKENS), half for importance, half for the loss.
    Step 0 removes nothing; each step zero-ablates round(step_fraction * n_heads) (at least 1)
    least important remaining heads, until every head is gone. Deterministic (no sampling).
    `batch_size` windows go through each forward (and backward) pass. Under torchrun (a
    collective: every rank calls it alike) each rank evaluates every world_size-th batch of
    windows and the batch sums are added in batch order: every rank gets the single-process
    curve exactly.
    """
    if not 0 < step_fraction <= 1:
        raise ConfigError(f"step_fraction {step_fraction} is out of range: give a value in (0, 1]")
    spec, model = loaded.spec, loaded.model
    evaluation = evaluation if evaluation is not None else EvalSpec(text=text)
    if evaluation.metric != "loss":
        raise ConfigError(f"pruning measures the loss on text, not {evaluation.metric}")
    windows = evaluation.build(loaded)
    if windows.input_ids.shape[0] < 2:
        raise InputTextError(
            "the text gives a single window: pruning needs a second window to measure "
            "importance on (give a longer --text)"
        )
    evalset, importance_set = _split(windows, 0), _split(windows, 1)
    n_total = spec.n_layers * spec.n_heads
    per_step = max(1, round(step_fraction * n_total))
    keep = torch.ones(spec.n_layers, spec.n_heads, dtype=torch.bool)  # [layer, head]
    removed: list[Head] = []
    rows = []
    n_steps = math.ceil(n_total / per_step) + 1
    show = progress and distributed.is_main()
    bar = tqdm(total=n_steps, desc="prune", unit="step", leave=False) if show else None
    for step in range(n_steps):
        now = _next_heads(model, importance_set, keep, per_step, batch_size) if step > 0 else []
        removed += now
        sums = ablated_sums(
            model, evalset, sorted(removed), [None] * spec.n_layers, batch_size, shard_batches=True
        )  # [n_units]
        row = {
            "step": step,
            "n_removed": len(removed),
            "fraction_removed": len(removed) / n_total,
            "heads_removed": format_heads(sorted(removed)),
            "step_heads": format_heads(now),
            "loss": float(sums.double().sum() / evalset.n_tokens),
        }
        if labels is not None:
            row["step_labelled"] = ";".join(f"{h}:{'+'.join(labels[h])}" for h in now if labels.get(h))
        rows.append(row)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    meta = {"model": str(loaded.name), "data": windows.description, "tokens": evaluation.tokens or "all"}
    return Result("pruning", pd.DataFrame(rows), meta)


def _next_heads(model, importance_set, keep: torch.Tensor, per_step: int, batch_size: int = BATCH_SIZE) -> list[Head]:
    """The `per_step` least important kept heads (Michel et al.), marked removed in `keep`."""
    n_heads = keep.shape[1]
    importance = head_importance(model, importance_set, keep, batch_size, shard_batches=True)  # [layer, head]
    scores = normalize_by_layer(importance, keep)  # [layer, head]
    scores = scores.masked_fill(~keep, math.inf).flatten()  # [layer * head]
    order = torch.argsort(scores, stable=True)[: min(per_step, int(keep.sum()))]
    heads = []
    for flat in order.tolist():
        keep[flat // n_heads, flat % n_heads] = False
        heads.append(Head(flat // n_heads, flat % n_heads))
    return heads


def removal_by_role(curve, labels: dict, seed: int = 0, n_perm: int = N_PERMUTATIONS) -> dict:
    """Are labelled heads removed later? Removal rank = 1 for the first head removed; returns
    `n_labelled`, `n_unlabelled`, `mean_rank_labelled`, `mean_rank_unlabelled` and `p_value`,
    the share of random relabellings (same group sizes, seeded) whose labelled mean rank is at
    least the observed one (one-sided; (1 + count) / (1 + n_perm), Phipson & Smyth 2010)."""
    order = [Head(*map(int, h.split("."))) for s in curve["step_heads"] for h in filter(None, s.split(","))]
    flags = torch.tensor([bool(labels.get(h)) for h in order])  # [n_heads] labelled, in removal order
    ranks = torch.arange(1, len(order) + 1, dtype=torch.float64)  # [n_heads]
    n_lab = int(flags.sum())
    out: dict[str, int | float | None] = {
        "n_labelled": n_lab,
        "n_unlabelled": len(order) - n_lab,
        "mean_rank_labelled": None,
        "mean_rank_unlabelled": None,
        "p_value": None,
    }
    if n_lab == 0 or n_lab == len(order):
        return out
    observed = float(ranks[flags].mean())
    gen = torch.Generator().manual_seed(seed)
    perms = torch.argsort(torch.rand(n_perm, len(order), generator=gen), dim=1)[:, :n_lab]  # [n_perm, n_lab]
    shuffled = ranks[perms].mean(1)  # [n_perm]
    out.update(
        mean_rank_labelled=observed,
        mean_rank_unlabelled=float(ranks[~flags].mean()),
        p_value=float((1 + (shuffled >= observed - 1e-12).sum()) / (1 + n_perm)),
    )
    return out


def heads_within(curve, tolerance: float = PRUNE_TOLERANCE) -> int:
    """How many heads can go before the loss first exceeds (1 + tolerance) x the unpruned loss."""
    limit = curve["loss"].iloc[0] * (1 + tolerance)
    n = 0
    for row in curve.itertuples():
        if row.loss > limit:
            break
        n = row.n_removed
    return int(n)
