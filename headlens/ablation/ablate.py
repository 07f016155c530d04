"""Ablating heads at z: a set of heads together (`ablate_heads`), or every head alone (`sweep_heads`).

The site is a head's own output z, the input of the output projection (headlens.intervene.replace).
Both return a headlens Result (headlens.results): the numbers in `.frame`, what they were measured under
in `.meta`. Every result reports its `metric` and that metric's `unit` (headlens.intervene.metrics.UNIT), the
metric's `clean` and `ablated` means over `n` scored positions, their change `delta` and a paired
bootstrap `ci95` (headlens.intervene.stats); loss metrics also keep `n_tokens`, `loss`,
`loss_ablated`, `delta_loss`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.ablation.store import SweepInterrupted, SweepStore
from headlens.classify.kinds import DEFAULT_TOKEN_BUDGET
from headlens.classify.roles import model_labels, resolve_heads, role_name
from headlens.errors import ConfigError, HeadlensError
from headlens.heads import Head, all_heads
from headlens.intervene.clean import clean_values, lookup, pass_count, run_sets
from headlens.intervene.evalspec import (
    ALL,
    ROLE_METRICS,
    SWEEP_TOKENS,
    EvalSpec,
    tokens_read,
)
from headlens.intervene.metrics import UNIT, check_choice, is_loss
from headlens.intervene.replace import replacements
from headlens.intervene.stacked import unit_sums_of
from headlens.intervene.stats import control_design, control_summary, head_seed, summarize
from headlens.intervene.sums import head_groups, stack_count, sweep_sums
from headlens.results import Result

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's; annotations are not evaluated at run time
    from typing_extensions import Unpack

    from headlens.load.models import LoadedModel


def model_label(loaded: LoadedModel) -> str:
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


class EvalFields(TypedDict, total=False):
    """EvalSpec's fields, accepted as keywords by ablate_heads and sweep_heads (they build the EvalSpec)."""

    metric: str | None
    text: Any
    prompts: Any
    reference: str | None
    bos: bool
    context: int | None
    tokens: int | str | None


def evaluation_of(
    evaluation: EvalSpec | None, fields: EvalFields, role: str | None = None
) -> tuple[EvalSpec, str | None]:
    """The EvalSpec of a call: `evaluation`, or one built from keyword fields (not both), and a line on
    the metric chosen (evalspec.choose_metric: a role's own metric when none is given)."""
    if evaluation is not None:
        if fields:
            raise ConfigError(f"give the evaluation set as `evaluation` or as keywords, not both: {', '.join(fields)}")
        return evaluation, None
    given: dict[str, Any] = dict(fields)  # the keyword fields, checked by EvalSpec
    return EvalSpec.for_role(role if role in ROLE_METRICS else None, given.pop("metric", None), **given)


def ablate_heads(
    loaded: LoadedModel,
    heads,
    method: str = "zero",
    evaluation: EvalSpec | None = None,
    *,
    seed: int = 0,
    control: int = 0,
    labels: dict | None = None,
    batch_size: int | None = None,
    chosen_by: str | None = None,
    progress: bool = False,
    **fields: Unpack[EvalFields],
) -> Result:
    """Ablate a set of heads together; how does the metric change?

    heads: list of Head, a spec string ("3.4,5.1", "layer:3", `all` = every head together) or a
    role (headlens.classify.roles); `each` (every head alone) is `sweep_heads`.
    evaluation: the evaluation set (headlens.intervene.evalspec.EvalSpec: metric, text, prompts,
    reference, bos, context, token budget), or its fields as keywords; with neither, a role's own
    metric (evalspec.ROLE_METRICS) or `loss`, at the default budget of DEFAULT_TOKENS tokens.
    Every set (the controls too) runs from the clean residual at its first ablated layer, and the
    clean run comes from headlens's cache when it was run before (headlens.intervene.clean).
    Returns a Result of kind "ablation" whose `meta` holds `model`, `heads` (["L.H"]), `method`, `metric`,
    `unit`, `n`, `clean`, `ablated`, `delta`,
    `ci95` ([low, high] paired bootstrap over the sequences used, seeded; None below 2 units), the
    loss keys for loss metrics, then `tokens` (the budget: a number or "all"), `tokens_read`, `data`,
    `reference`, `resampled` (in words), `metric_why` when the metric was chosen for a role,
    `chosen_by` for a role (or as given, for heads a caller resolved from one), and with `control`
    = K > 0 the random same-layer-count sets (headlens.intervene.stats: `k`, `n_possible`, `exact`,
    `rank`, `p_value`, `p_min`, ...). `progress` shows a bar over the forward passes with the time left;
    `batch_size` sequences go through each forward pass (None: packed by their lengths, EvalSet.row_batches).
    Its `frame` (ablation_rows): the chosen set's row (`set` "chosen", `heads` "L.H,L.H", `n`, `clean`,
    `ablated`, `delta`, `ci95_low`, `ci95_high`, the loss columns), then one row per control set (`set`
    "control", `heads`, `delta`).
    """
    role = role_name(heads) if isinstance(heads, str) else None
    evaluation, why = evaluation_of(evaluation, fields, role)
    check_choice(method, evaluation.metric)
    heads, resolved_by = resolve_heads(loaded, heads, labels)
    chosen_by = resolved_by or chosen_by
    evalset = evaluation.build(loaded, seed)
    design = control_design(heads, loaded.spec.n_heads, control, seed) if control else None
    sets = [heads, *(design["sets"] if design else [])]
    reps = replacements(loaded.model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]
    cached = lookup(loaded, evalset, batch_size)
    total = pass_count(evalset, len(sets), batch_size, cached[1] is not None)
    with tqdm(total=total, desc="ablate", unit="pass", leave=False, disable=not progress) as bar:
        clean, values = run_sets(loaded, evalset, sets, reps, batch_size, cached, on_pass=lambda: bar.update(1))
    base, chosen, *controls = unit_sums_of(evalset, torch.cat([clean[None], values]))  # [n_units] each
    result: dict[str, Any] = {
        "model": model_label(loaded),
        "heads": [str(h) for h in heads],
        "method": method,
        "metric": evalset.metric,
        "unit": UNIT[evalset.metric],
    }
    result.update(summarize(base, chosen, counts, seed, is_loss(evalset.metric)))
    result.update(tokens=evaluation.tokens or ALL, tokens_read=tokens_read(evalset))
    result.update(describe(evalset, method))
    if why:
        result["metric_why"] = why
    if chosen_by:
        result["chosen_by"] = chosen_by
    if design is not None:
        deltas = [float((row - base).sum() / counts.sum()) for row in controls]
        result["control"] = control_summary(
            result["delta"], deltas, design["sets"], seed, design["n_possible"], design["exact"]
        )
    return Result("ablation", meta=result, rows=ablation_rows(result))


def ablation_rows(result: dict) -> list[dict]:
    """The rows of a set ablation's frame from its meta: the chosen set, then each control set."""
    low, high = result["ci95"] or (float("nan"), float("nan"))
    chosen: dict[str, Any] = {"set": "chosen", "heads": ",".join(result["heads"])}
    chosen.update({key: result[key] for key in ("n", "clean", "ablated", "delta")})
    chosen.update(ci95_low=low, ci95_high=high, **{key: result[key] for key in LOSS_COLUMNS if key in result})
    control = result.get("control") or {"sets": [], "deltas": []}
    return [chosen] + [
        {"set": "control", "heads": ",".join(s), "delta": d}
        for s, d in zip(control["sets"], control["deltas"], strict=True)
    ]


def sweep_heads(
    loaded: LoadedModel,
    method: str = "zero",
    evaluation: EvalSpec | None = None,
    *,
    seed: int = 0,
    out=None,
    resume: bool = False,
    heads=None,
    batch_size: int | None = None,
    progress: bool = False,
    **fields: Unpack[EvalFields],
) -> Result:
    """Ablate every head alone (or each of `heads`), exactly, with the fast layer-by-layer sweep
    (`batch_size` evaluation sequences per forward pass; None: packed by their lengths, EvalSet.row_batches).
    `evaluation`: the evaluation set (EvalSpec, or its fields as keywords; the default budget is
    SWEEP_TOKENS tokens); its clean run comes from headlens's cache when it was run before.

    Returns a Result of kind "sweep": its frame sorted by (layer, head) with columns `layer`, `head`, then `n`, `clean`,
    `ablated`, `delta`, `ci95_low`, `ci95_high` (NaN below 2 bootstrap units), and for loss
    metrics `n_tokens`, `loss`, `loss_ablated`, `delta_loss`. Its meta holds `model`, `method`, `metric`,
    `unit`, `tokens`, `data`, `reference`, `resampled`. With `out` (a directory) each finished row is appended durably;
    `resume=True` continues a sweep found there (headlens.ablation.store). An interrupt (Ctrl-C)
    raises SweepInterrupted, a KeyboardInterrupt that says how many rows were saved where.
    """
    if evaluation is None:
        fields.setdefault("tokens", SWEEP_TOKENS)
    evaluation, _ = evaluation_of(evaluation, fields)
    metric = check_choice(method, evaluation.metric)
    spec = loaded.spec
    heads = sorted(Head(*h) for h in heads) if heads is not None else all_heads(spec.n_layers, spec.n_heads)
    evalset = evaluation.build(loaded, seed)
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
    # many processes: this rank's share of the pending passes (the heads one pass stacks are fixed by
    # `heads` alone, so every rank computes its rows as one process would, and no pass runs twice)
    groups = [g for g in head_groups(heads, stack_count(evalset, batch_size)) if any(h not in rows for h in g)]
    todo = [h for group in distributed.shard(groups) for h in group if h not in rows]
    skip = set(heads) - set(todo)
    if todo:
        try:
            show = progress and distributed.is_main()
            _sweep_rows(loaded, evalset, method, seed, heads, rows, store, show, skip, batch_size)
        except KeyboardInterrupt:
            saved = len(rows) if store is None else store.saved(heads)  # the rows on disk, counted again
            raise SweepInterrupted(saved, len(heads), None if store is None else store.dir) from None
    for part in distributed.all_gather({h: rows[h] for h in todo}):
        rows.update(part)
    import pandas as pd  # the sweep's frame; a set ablation starts sooner without pandas (BENCHMARKS.md)

    columns = SWEEP_COLUMNS + (LOSS_COLUMNS if is_loss(metric) else [])
    frame = pd.DataFrame([rows[h] for h in heads], columns=columns)
    frame = frame.sort_values(["layer", "head"], ignore_index=True)
    meta: dict[str, Any] = {"model": model_label(loaded), "method": method, "metric": metric, "unit": UNIT[metric]}
    meta.update(tokens=evaluation.tokens or ALL, **describe(evalset, method))
    if store is not None and distributed.is_main():
        store.write_table(frame)
    return Result("sweep", frame, meta)


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


def _sweep_rows(
    loaded: LoadedModel, evalset, method, seed, heads, rows, store, progress, skip, batch_size: int | None
) -> None:
    """Fill `rows` (head -> row dict) for the heads not in `skip` (done, or another rank's),
    appending each to `store`. The clean run comes from the cache (or runs first, then is cached);
    with `progress`, an estimate of the time is printed first and a bar shows the time left."""
    model = loaded.model
    reps = replacements(model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]
    pending = [h for h in heads if h not in skip]
    if progress:
        from headlens.ablation.estimate import sweep_estimate  # a sweep's only: off a set ablation's path

        tqdm.write(sweep_estimate(loaded, evalset, pending, lookup(loaded, evalset, batch_size)[1] is not None))
    base = unit_sums_of(evalset, clean_values(loaded, evalset, batch_size))  # [n_units]

    def on_head(head: Head, sums: torch.Tensor) -> None:
        summary = summarize(base, sums, counts, head_seed(seed, *head), is_loss(evalset.metric))
        low, high = summary.pop("ci95") or (float("nan"), float("nan"))
        row = {"layer": head.layer, "head": head.head, **summary, "ci95_low": low, "ci95_high": high}
        rows[head] = row
        if store is not None:
            store.append(row)

    with tqdm(total=len(pending), desc="ablate", unit="head", leave=False, disable=not progress) as bar:
        sweep_sums(model, evalset, heads, reps, on_head, skip=skip, batch_size=batch_size, bar=bar)


ROLE_EXPERIMENTS = (("induction", "repeat"), ("retrieval", "needle"))  # role -> the task it should carry
# Longest needle test of a role experiment: the token budget the labelling probes use (headlens.classify.kinds), so the
# retrieval heads are tested on needles as long as those they were found on. On SmolLM2 that is 15 tests of 64,
# 128 and 256 tokens (2,240 tokens per ablated run) instead of 256, 512 and 1,024 (8,960) at EVAL_CONTEXT.
ROLE_CONTEXT = DEFAULT_TOKEN_BUDGET


def role_experiments(
    loaded: LoadedModel,
    control: int = 20,
    seed: int = 0,
    labels: dict | None = None,
    progress: bool = False,
    context: int = ROLE_CONTEXT,
) -> list[Result]:
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
                tokens=None,
            )
            result.meta.update(chosen_by=f"heads labelled {role} by {source}", role=role)
            results.append(result)
    return results
