"""Many head sets, each ablated together, from a cached clean residual: a role's set and its controls.

Ablating heads of layer F and later cannot change anything before layer F: the residual stream
entering the first ablated layer of every set is the clean one. `set_sums` runs layers 0..F-1
once per batch, keeps the residual entering F, and runs each set from F on with its heads' z
replaced at the z site (the hooks `ablation_hooks` uses, headlens.intervene.replace), so each
set's sums are those of a full forward pass with that set ablated. The random control sets of a
role share its per-layer counts (headlens.intervene.stats.control_design), hence its F: with
the role's heads in layers 18-23 of 30, each set costs 12 layers instead of 30.
`sets_per_pass` sets go through one forward pass as stacked copies of the batch (copy c: set c).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlens.arch import adapter_for
from headlens.arch.kernels import no_pattern_kernels
from headlens.heads import Head
from headlens.intervene.evalset import BATCH_SIZE
from headlens.intervene.replace import Replacement, heads_by_layer, layer_replacement
from headlens.intervene.sums import resid_values

# Sets stacked as batch copies per forward pass: the same FLOPs in fewer, larger calls. Four control
# sets a pass gained no more than the spread on a role experiment (BENCHMARKS.md), so one a pass; the
# single-head sweep stacks by its row budget (headlens.intervene.sums.stack_count).
SETS_PER_PASS = 1


def first_layer(head_sets: Sequence[Sequence[Head]], n_layers: int) -> int:
    """The first layer any set ablates (n_layers when every set is empty)."""
    return min((h.layer for heads in head_sets for h in heads), default=n_layers)


def set_sums(
    model,
    evalset,
    head_sets: Sequence[Sequence[Head]],
    reps: Sequence[Replacement],
    batch_size: int | None = BATCH_SIZE,
    sets_per_pass: int = SETS_PER_PASS,
    on_pass=None,
) -> torch.Tensor:
    """Per-unit sums of the metric with each set of `head_sets` ablated together (an empty set:
    the clean model): [n_sets, n_units] float64 (set_values, summed per bootstrap unit)."""
    values = set_values(model, evalset, head_sets, reps, batch_size, sets_per_pass, on_pass)  # [n_sets, n_scored]
    return unit_sums_of(evalset, values)  # [n_sets, n_units]


def unit_sums_of(evalset, values: torch.Tensor) -> torch.Tensor:
    """Per-unit sums [..., n_units] float64 of per-position values [..., n_scored]."""
    units = evalset.units[evalset.counted]  # [n_scored]
    shape = (*values.shape[:-1], evalset.n_units)
    return torch.zeros(shape, dtype=torch.float64).index_add_(values.dim() - 1, units, values.double())


def set_values(
    model,
    evalset,
    head_sets: Sequence[Sequence[Head]],
    reps: Sequence[Replacement],
    batch_size: int | None = BATCH_SIZE,
    sets_per_pass: int = SETS_PER_PASS,
    on_pass=None,
) -> torch.Tensor:
    """The metric's value at every scored position (row-major over `evalset.counted`) with each set of
    `head_sets` ablated together (an empty set: the clean model): [n_sets, n_scored] float64.
    `reps`: per layer what z becomes (headlens.intervene.replace.replacements). `on_pass()` is called
    after each forward pass."""
    adapter = adapter_for(model)
    first = first_layer(head_sets, adapter.n_layers)
    out = torch.zeros(len(head_sets), evalset.n_tokens, dtype=torch.float64)  # [n_sets, n_scored]
    at = 0
    with torch.no_grad(), no_pattern_kernels(model):
        for rows in evalset.row_batches(batch_size):
            ctx = adapter.context(*evalset.batch(rows))
            clean = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
            for layer in range(first):
                clean = adapter.block(layer, clean, ctx)  # the residual entering `first`, for every set
            n_scored = int(evalset.counted[rows].sum())
            for start in range(0, len(head_sets), sets_per_pass):
                group = head_sets[start : start + sets_per_pass]
                final = _run_sets(adapter, clean, ctx, group, reps, rows, first)  # [copies * batch, pos, d_model]
                values = resid_values(adapter, final, evalset, rows, copies=len(group))  # [copies, n_scored]
                out[start : start + len(group), at : at + n_scored] = values.double().cpu()
                if on_pass is not None:
                    on_pass()
            at += n_scored
    return out


def _run_sets(adapter, clean, ctx, group, reps, rows: slice, first: int) -> torch.Tensor:
    """Final residual of `group`'s sets, stacked copies of the batch from layer `first` on:
    [copies * batch, pos, d_model]."""
    copies, n_rows = len(group), clean.shape[0]
    resid = clean.repeat(copies, 1, 1) if copies > 1 else clean  # [copies * batch, pos, d_model]
    per_set = [heads_by_layer(heads) for heads in group]
    with adapter.hooks() as hooks:
        for layer in range(first, adapter.n_layers):
            edits = [(copy, by_layer[layer]) for copy, by_layer in enumerate(per_set) if layer in by_layer]
            if edits:
                rep = layer_replacement(reps[layer], rows, clean.shape[1])
                hooks.z(layer, _z_edit(edits, rep, n_rows))
        for layer in range(first, adapter.n_layers):
            resid = adapter.block(layer, resid, ctx, copies)
    return resid


def _z_edit(edits: list[tuple[int, list[Head]]], rep: Replacement, n_rows: int):
    """z -> z with each copy's heads replaced: by 0, or by `rep` ([batch | 1, pos | 1, head, d_head])."""

    def edit(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()  # [copies * batch, pos, head, d_head]
        for copy, heads in edits:
            block = z[copy * n_rows : (copy + 1) * n_rows]  # [batch, pos, head, d_head]
            for head in heads:
                block[:, :, head.head] = 0.0 if rep is None else rep[:, :, head.head].to(z.dtype)
        return z

    return edit
