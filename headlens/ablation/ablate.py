"""Ablating heads at z: a set of heads together (`ablate_heads`), or every head alone (`sweep_heads`).

The site is a head's own output z, the input of the output projection (headlens.ablation.replace).
Every result reports its `metric` and that metric's `unit` (headlens.ablation.metrics.UNIT), the
metric's `clean` and `ablated` means over `n` scored positions, their change `delta` and a paired
bootstrap `ci95` (headlens.ablation.stats); loss metrics also keep `n_tokens`, `loss`,
`loss_ablated`, `delta_loss`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.ablation.evalset import build_evalset
from headlens.ablation.metrics import UNIT, check_choice, is_loss
from headlens.ablation.replace import replacements
from headlens.ablation.roles import model_labels, resolve_heads
from headlens.ablation.stacked import set_sums
from headlens.ablation.stats import control_design, control_summary, head_seed, summarize
from headlens.ablation.store import SweepInterrupted, SweepStore
from headlens.ablation.sweep import ablated_sums, base_sums, sweep_sums
from headlens.classify.kinds import DEFAULT_TOKEN_BUDGET
from headlens.errors import HeadlensError
from headlens.heads import Head, all_heads


def model_label(loaded) -> str:
    return str(loaded.name)


def describe(evalset, method: str) -> dict:
    """What was measured, where replacements came from and what the bootstrap resampled, in words."""
    reference = (
        "none (zero ablation)"
        if method == "zero"
        else (
            f"mean of z over every position of {evalset.reference_label}"
            if method == "mean"
            else f"z resampled (seeded) from other positions / sequences of {evalset.reference_label}"
        )
    )
    return {"data": evalset.description, "reference": reference, "resampled": evalset.unit_label}


def ablate_heads(
    loaded,
    heads,
    method: str = "zero",
    metric: str = "loss",
    text: str | None = None,
    seed: int = 0,
    progress: bool = False,
    prompts: list[dict] | None = None,
    reference: str | None = None,
    bos: bool = True,
    control: int = 0,
    labels: dict | None = None,
    batch_size: int | None = None,
    chosen_by: str | None = None,
    context: int | None = None,
) -> dict:
    """Ablate a set of heads together; how does the metric change?

    heads: list of Head, a spec string ("3.4,5.1", "layer:3", `all` = every head together) or a
    role (headlens.ablation.roles); `each` (every head alone) is `sweep_heads`.
    metric, text, prompts, reference, bos, context: the evaluation set (headlens.ablation.evalset).
    Returns `model`, `heads` (["L.H"]), `method`, `metric`, `unit`, `n`, `clean`, `ablated`, `delta`,
    `ci95` ([low, high] paired bootstrap, seeded; None below 2 units), the loss keys for loss
    metrics, then `data`, `reference`, `resampled` (in words), `chosen_by` for a role (or as given,
    for heads a caller resolved from one), and with `control` = K > 0 the random same-layer-count
    sets (headlens.ablation.stats: `k`, `n_possible`, `exact`, `rank`, `p_value`, `p_min`, ...).
    `progress` shows a bar over the forward passes; `batch_size` sequences go through each forward pass
    (None: packed by their lengths, headlens.ablation.evalset.EvalSet.row_batches).
    """
    metric = check_choice(method, metric)
    heads, resolved_by = resolve_heads(loaded, heads, labels)
    chosen_by = resolved_by or chosen_by
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos, context)
    model = loaded.model
    design = control_design(heads, loaded.spec.n_heads, control, seed) if control else None
    sets = design["sets"] if design else []
    bar = tqdm(total=2 + len(sets), desc="ablate", unit="pass", leave=False) if progress else None
    reps = replacements(model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]
    try:
        base, chosen, *controls = _sums(model, evalset, [[], heads, *sets], reps, batch_size, bar, design is not None)
        result: dict[str, Any] = {
            "model": model_label(loaded),
            "heads": [str(h) for h in heads],
            "method": method,
            "metric": metric,
            "unit": UNIT[metric],
        }
        result.update(summarize(base, chosen, counts, seed, is_loss(metric)))
        result.update(describe(evalset, method))
        if chosen_by:
            result["chosen_by"] = chosen_by
        if design is not None:
            deltas = [float((row - base).sum() / counts.sum()) for row in controls]
            result["control"] = control_summary(
                result["delta"], deltas, sets, seed, design["n_possible"], design["exact"]
            )
    finally:
        if bar is not None:
            bar.close()
    return result


def _sums(model, evalset, head_sets, reps, batch_size: int | None, bar, stacked: bool) -> list[torch.Tensor]:
    """Per-unit sums [n_units] with each set ablated: by hooks on full forward passes, or (`stacked`:
    a set and its controls) all from one cached clean residual (headlens.ablation.stacked)."""
    if stacked:
        n_batches = len(evalset.row_batches(batch_size))
        tick = None if bar is None else (lambda: bar.update(1 / n_batches))
        return list(set_sums(model, evalset, head_sets, reps, batch_size, on_pass=tick))  # [n_units] each
    out = []
    for heads in head_sets:
        out.append(ablated_sums(model, evalset, heads, reps, batch_size=batch_size))  # [n_units]
        if bar is not None:
            bar.update(1)
    return out


def sweep_heads(
    loaded,
    method: str = "zero",
    metric: str = "loss",
    text: str | None = None,
    seed: int = 0,
    progress: bool = False,
    out=None,
    resume: bool = False,
    heads=None,
    prompts: list[dict] | None = None,
    reference: str | None = None,
    bos: bool = True,
    batch_size: int | None = None,
):
    """Ablate every head alone (or each of `heads`), exactly, with the fast layer-by-layer sweep
    (`batch_size` evaluation sequences per forward pass; None: packed by their lengths, EvalSet.row_batches).

    Returns a DataFrame sorted by (layer, head) with columns `layer`, `head`, then `n`, `clean`,
    `ablated`, `delta`, `ci95_low`, `ci95_high` (NaN below 2 bootstrap units), and for loss
    metrics `n_tokens`, `loss`, `loss_ablated`, `delta_loss`. `frame.attrs` holds `metric`, `unit`,
    `data`, `reference`, `resampled`. With `out` (a directory) each finished row is appended durably;
    `resume=True` continues a sweep found there (headlens.ablation.store). An interrupt (Ctrl-C)
    raises SweepInterrupted, a KeyboardInterrupt that says how many rows were saved where.
    """
    metric = check_choice(method, metric)
    spec = loaded.spec
    heads = sorted(Head(*h) for h in heads) if heads is not None else all_heads(spec.n_layers, spec.n_heads)
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos)
    store = None
    if out is not None:
        manifest = {
            "model": model_label(loaded),
            "method": method,
            "metric": metric,
            "seed": seed,
            "data_sha256": evalset.data_hash,
            "n_layers": spec.n_layers,
            "n_heads": spec.n_heads,
        }
        store = _open_store(out, manifest, resume)
    rows = {h: r for h, r in (store.done.items() if store else []) if h in heads}
    # many processes: this rank's share of the pending heads, the rest skipped (the groups stacked
    # in one pass are fixed by `heads` alone, so every rank computes its rows as one process would)
    todo = list(distributed.shard(h for h in heads if h not in rows))
    skip = set(heads) - set(todo)
    if todo:
        try:
            _sweep_rows(
                loaded.model,
                evalset,
                method,
                seed,
                heads,
                rows,
                store,
                progress and distributed.is_main(),
                skip,
                batch_size,
            )
        except KeyboardInterrupt:
            saved = len(rows) if store is None else store.saved(heads)  # the rows on disk, counted again
            raise SweepInterrupted(saved, len(heads), None if store is None else store.dir) from None
    for part in distributed.all_gather({h: rows[h] for h in todo}):
        rows.update(part)
    columns = SWEEP_COLUMNS + (LOSS_COLUMNS if is_loss(metric) else [])
    frame = pd.DataFrame([rows[h] for h in heads], columns=columns)
    frame = frame.sort_values(["layer", "head"], ignore_index=True)
    frame.attrs.update(metric=metric, unit=UNIT[metric], **describe(evalset, method))
    if store is not None and distributed.is_main():
        store.write_table(frame)
    return frame


def _open_store(out, manifest: dict, resume: bool) -> SweepStore:
    """The sweep store; under torch.distributed rank 0 opens (and checks) it first, every rank
    then opens it to read the finished rows and append its own (rows.rank<r>.jsonl)."""
    if distributed.world_size() == 1:
        return SweepStore(out, manifest, resume)
    store, error = None, None
    if distributed.is_main():
        try:
            store = SweepStore(out, manifest, resume)
        except HeadlensError as exc:
            error = exc
    distributed.broadcast_error(error)
    if store is None:
        store = SweepStore(out, manifest, resume=True, rows_file=f"rows.rank{distributed.rank()}.jsonl")
    distributed.barrier()  # every rank has read the finished rows before any appends
    return store


SWEEP_COLUMNS = ["layer", "head", "n", "clean", "ablated", "delta", "ci95_low", "ci95_high"]
LOSS_COLUMNS = ["n_tokens", "loss", "loss_ablated", "delta_loss"]


def _sweep_rows(model, evalset, method, seed, heads, rows, store, progress, skip, batch_size: int | None) -> None:
    """Fill `rows` (head -> row dict) for the heads not in `skip` (done, or another rank's),
    appending each to `store`."""
    reps = replacements(model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]
    base = base_sums(model, evalset, batch_size)  # [n_units]

    def on_head(head: Head, sums: torch.Tensor) -> None:
        summary = summarize(base, sums, counts, head_seed(seed, *head), is_loss(evalset.metric))
        low, high = summary.pop("ci95") or (float("nan"), float("nan"))
        row = {"layer": head.layer, "head": head.head, **summary, "ci95_low": low, "ci95_high": high}
        rows[head] = row
        if store is not None:
            store.append(row)

    bar = tqdm(total=len(set(heads) - skip), desc="ablate", unit="head", leave=False) if progress else None
    try:
        sweep_sums(model, evalset, heads, reps, on_head, skip=skip, batch_size=batch_size, bar=bar)
    finally:
        if bar is not None:
            bar.close()


ROLE_EXPERIMENTS = (("induction", "repeat"), ("retrieval", "needle"))  # role -> the task it should carry
# Longest needle test of a role experiment: the token budget the labelling probes use (headlens.classify.kinds), so the
# retrieval heads are tested on needles as long as those they were found on. On SmolLM2 that is 15 tests of 64,
# 128 and 256 tokens (2,240 tokens per ablated run) instead of 256, 512 and 1,024 (8,960) at EVAL_CONTEXT.
ROLE_CONTEXT = DEFAULT_TOKEN_BUDGET


def role_experiments(
    loaded,
    control: int = 20,
    seed: int = 0,
    labels: dict | None = None,
    progress: bool = False,
    context: int = ROLE_CONTEXT,
) -> list[dict]:
    """Induction heads on `repeat` and retrieval heads on `needle` (Wu et al. 2024; tests of at most
    `context` tokens), each against `control` random sets of the same per-layer counts: ablate_heads
    results, one per role that some head carries (labels from `labels` or from classifying the model once)."""
    source = "the labels given" if labels is not None else "classifying the model (default probes)"
    labels = model_labels(loaded, labels)
    results = []
    for role, metric in ROLE_EXPERIMENTS:
        if any(role in names for names in labels.values()):
            result = ablate_heads(
                loaded,
                role,
                metric=metric,
                seed=seed,
                progress=progress,
                control=control,
                labels=labels,
                context=context,
            )
            results.append({**result, "chosen_by": f"heads labelled {role} by {source}", "role": role})
    return results
