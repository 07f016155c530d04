"""Ablation of heads at the right site: z, the input of the output projection.

Zeroing a slice of the attention module's *output* mixes heads (nnsight #525, ACDC PR #82);
a head's own output is z = the input of the output projection (GPT-2 `attn.c_proj`, Llama
`o_proj`, GPT-NeoX `dense`; TransformerLens `hook_z`), reached through the architecture
adapter's `hook_z`. The shared output bias b_O stays.

Every result reports the metric's `clean` and `ablated` means over `n` scored positions, their
change `delta` and a paired bootstrap `ci95` (headlens.ablation.evalset); loss metrics also keep
`n_tokens`, `loss`, `loss_ablated`, `delta_loss`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.ablation.datasets import build_evalset
from headlens.ablation.evalset import bootstrap_ci, head_seed
from headlens.ablation.metrics import KIND, check_choice, is_loss
from headlens.ablation.replace import heads_by_layer, layer_replacement, replacements
from headlens.ablation.roles import control_sets, control_summary, model_labels, resolve_heads
from headlens.ablation.runner import scored_values
from headlens.ablation.store import SweepStore
from headlens.ablation.sweep import base_sums, sweep_sums
from headlens.arch import adapter_for
from headlens.errors import HeadlensError
from headlens.heads import Head, all_heads


@contextlib.contextmanager
def ablation_hooks(model, heads: Sequence[Head], replacement: dict[Head, torch.Tensor] | None = None):
    """Within the block, each head's z is replaced: by 0 (zero ablation), or by
    `replacement[head]` (a tensor broadcastable to [batch, pos, d_head]: mean or resampled z).

    Hooks are removed on exit, error included.
    """
    adapter = adapter_for(model)
    handles = []

    def make_edit(layer_heads: list[Head]):
        def edit(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()  # [batch, pos, head, d_head]
            for head in layer_heads:
                if replacement is not None and head in replacement:
                    z[:, :, head.head] = replacement[head].to(z.dtype)
                else:
                    z[:, :, head.head] = 0.0
            return z

        return edit

    try:
        for layer, layer_heads in heads_by_layer(heads).items():
            handles.append(adapter.hook_z(layer, make_edit(layer_heads)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def token_losses(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position: [batch, pos - 1], NaN where the target is padding.

    logits [batch, pos, d_vocab]; position t predicts token t + 1.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, pos-1, d_vocab]
    loss = -logp.gather(-1, input_ids[:, 1:, None])[..., 0]  # [batch, pos-1]
    valid = mask[:, 1:] & mask[:, :-1]
    return loss.masked_fill(~valid, float("nan"))


def model_label(loaded) -> str:
    return str(loaded.name)


def ablated_sums(model, evalset, heads: Sequence[Head], reps, batch_size: int = 4,
                 shard_batches: bool = False) -> torch.Tensor:
    """Per-unit sums of the metric [n_units] with `heads` ablated together, by hooks on the
    full forward pass of the base model (the plain way: the reference the fast sweep is checked against).

    `shard_batches` (a collective: every rank must call it with the same arguments): each rank runs
    every world_size-th batch and the batches' sums are added in batch order on every rank, so the
    result equals one process's exactly."""
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    total = torch.zeros(evalset.n_units, dtype=torch.float64)  # [n_units]
    n_seq = evalset.input_ids.shape[0]
    starts = range(0, n_seq, batch_size)
    parts = {}  # batch index -> (first unit, its sums over its units) when sharded
    with torch.no_grad():
        for index, start in (distributed.shard(enumerate(starts)) if shard_batches else enumerate(starts)):
            rows = slice(start, min(start + batch_size, n_seq))
            replacement = {}
            for head in heads:
                rep = layer_replacement(reps[head.layer], rows)
                if rep is not None:
                    replacement[head] = rep[:, :, head.head]  # [batch | 1, pos | 1, d_head]
            ids, mask = evalset.input_ids[rows].to(device), evalset.mask[rows].to(device)  # [batch, pos]
            with ablation_hooks(model, heads, replacement):
                hidden = adapter.run_trunk(ids, mask)  # [batch, pos, d_model], final norm applied
            seq, pos = torch.nonzero(evalset.counted[rows].to(device), as_tuple=True)  # scored pairs
            values = scored_values(hidden[seq, pos], adapter.unembed(), evalset, rows, seq, pos)  # [n_scored]
            units = evalset.units[rows].to(device)[seq, pos].cpu()  # [n_scored]
            batch_sums = torch.zeros_like(total).index_add_(0, units, values.double().cpu())  # [n_units]
            if not shard_batches:
                total += batch_sums  # batches in order: the sum sum_in_order reproduces
            elif len(units):
                low, high = int(units.min()), int(units.max()) + 1  # this batch's units (others get + 0.0)
                parts[index] = (low, batch_sums[low:high])
    return distributed.sum_in_order(parts, total) if shard_batches else total


def summarize(base: torch.Tensor, ablated: torch.Tensor, counts: torch.Tensor, seed: int, metric: str) -> dict:
    """`n`, `clean`, `ablated`, `delta` (means over scored positions) and the paired bootstrap
    `ci95` (None with fewer than 2 units); loss metrics add `n_tokens`, `loss`, `loss_ablated`,
    `delta_loss` (the same numbers under their loss names)."""
    n = int(counts.sum())
    clean = float(base.double().sum() / n)
    after = float(ablated.double().sum() / n)
    out = {"n": n, "clean": clean, "ablated": after, "delta": after - clean,
           "ci95": bootstrap_ci(base, ablated, counts, seed)}
    if KIND[metric] == "loss":
        out.update(n_tokens=n, loss=clean, loss_ablated=after, delta_loss=after - clean)
    return out


def describe(evalset, method: str) -> dict:
    """What was measured, where replacements came from and what the bootstrap resampled, in words."""
    reference = "none (zero ablation)" if method == "zero" else (
        f"mean of z over every position of {evalset.reference_label}" if method == "mean"
        else f"z resampled (seeded) from other positions / sequences of {evalset.reference_label}")
    return {"data": evalset.description, "reference": reference, "resampled": evalset.unit_label}


# Ablating a set of heads, and every head alone ---------------------------------------------------

BATCH = 4  # sequences per forward pass


def ablate_heads(loaded, heads, method: str = "zero", metric: str = "loss", text: str | None = None,
                 seed: int = 0, progress: bool = False, prompts: list[dict] | None = None,
                 reference: str | None = None, bos: bool = True, control: int = 0,
                 labels: dict | None = None, batch_size: int = BATCH) -> dict:
    """Ablate a set of heads together; how does the metric change?

    heads: list of Head, a spec string ("3.4,5.1", "layer:3") or a role (headlens.ablation.roles).
    metric, text, prompts, reference, bos: the evaluation set (headlens.ablation.datasets).
    Returns `model`, `heads` (["L.H"]), `method`, `metric`, `n`, `clean`, `ablated`, `delta`,
    `ci95` ([low, high] paired bootstrap, seeded; None below 2 units), the loss keys for loss
    metrics, then `data`, `reference`, `resampled` (in words), `chosen_by` for a role, and with
    `control` = K > 0 the K random same-layer-count sets (headlens.ablation.roles.control_summary).
    `progress` shows a bar over the forward passes; `batch_size` sequences go through each forward pass.
    """
    metric = check_choice(method, metric)
    heads, chosen_by = resolve_heads(loaded, heads, labels)
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos)
    model = loaded.model
    sets = control_sets(heads, loaded.spec.n_heads, control, seed) if control else []
    bar = tqdm(total=2 + len(sets), desc="ablate", unit="pass", leave=False) if progress else None
    reps = replacements(model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]

    def run(head_set: list[Head]) -> torch.Tensor:
        sums = ablated_sums(model, evalset, head_set, reps, batch_size=batch_size)  # [n_units]
        if bar is not None:
            bar.update(1)
        return sums

    try:
        base = run([])
        result = {"model": model_label(loaded), "heads": [str(h) for h in heads], "method": method,
                  "metric": metric}
        result.update(summarize(base, run(heads), counts, seed, metric))
        result.update(describe(evalset, method))
        if chosen_by:
            result["chosen_by"] = chosen_by
        if sets:
            deltas = [float((run(s) - base).sum() / counts.sum()) for s in sets]
            result["control"] = control_summary(result["delta"], deltas, sets, seed)
    finally:
        if bar is not None:
            bar.close()
    return result


def sweep_heads(loaded, method: str = "zero", metric: str = "loss", text: str | None = None, seed: int = 0,
                progress: bool = False, out=None, resume: bool = False, heads=None,
                prompts: list[dict] | None = None, reference: str | None = None, bos: bool = True,
                batch_size: int = BATCH):
    """Ablate every head alone (or each of `heads`), exactly, with the fast layer-by-layer sweep
    (`batch_size` evaluation sequences per forward pass).

    Returns a DataFrame sorted by (layer, head) with columns `layer`, `head`, then `n`, `clean`,
    `ablated`, `delta`, `ci95_low`, `ci95_high` (NaN below 2 bootstrap units), and for loss
    metrics `n_tokens`, `loss`, `loss_ablated`, `delta_loss`. `frame.attrs` holds `data`,
    `reference`, `resampled`. With `out` (a directory) each finished row is appended durably;
    `resume=True` continues a sweep found there (headlens.ablation.store).
    """
    metric = check_choice(method, metric)
    spec = loaded.spec
    heads = sorted(Head(*h) for h in heads) if heads is not None else all_heads(spec.n_layers, spec.n_heads)
    evalset = build_evalset(loaded, metric, text, seed, prompts, reference, bos)
    store = None
    if out is not None:
        manifest = {"model": model_label(loaded), "method": method, "metric": metric, "seed": seed,
                    "data_sha256": evalset.data_hash, "n_layers": spec.n_layers, "n_heads": spec.n_heads}
        store = _open_store(out, manifest, resume)
    rows = {h: r for h, r in (store.done.items() if store else []) if h in heads}
    # many processes: this rank's share of the pending heads, the rest skipped (the groups stacked
    # in one pass are fixed by `heads` alone, so every rank computes its rows as one process would)
    todo = list(distributed.shard(h for h in heads if h not in rows))
    skip = set(heads) - set(todo)
    if todo:
        _sweep_rows(loaded.model, evalset, method, seed, heads, rows, store, progress and distributed.is_main(),
                    skip, batch_size)
    for part in distributed.all_gather({h: rows[h] for h in todo}):
        rows.update(part)
    columns = SWEEP_COLUMNS + (LOSS_COLUMNS if is_loss(metric) else [])
    frame = pd.DataFrame([rows[h] for h in heads], columns=columns)
    frame = frame.sort_values(["layer", "head"], ignore_index=True)
    frame.attrs.update(describe(evalset, method))
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


def _sweep_rows(model, evalset, method, seed, heads, rows, store, progress, skip, batch_size: int = BATCH) -> None:
    """Fill `rows` (head -> row dict) for the heads not in `skip` (done, or another rank's),
    appending each to `store`."""
    reps = replacements(model, evalset, method, seed, batch_size=batch_size)
    counts = evalset.unit_counts()  # [n_units]
    base = base_sums(model, evalset, batch_size)  # [n_units]

    def on_head(head: Head, sums: torch.Tensor) -> None:
        summary = summarize(base, sums, counts, head_seed(seed, *head), evalset.metric)
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


def role_experiments(loaded, control: int = 20, seed: int = 0, labels: dict | None = None,
                     progress: bool = False) -> list[dict]:
    """Induction heads on `repeat` and retrieval heads on `needle` (Wu et al. 2024), each against
    `control` random sets of the same per-layer counts: ablate_heads results, one per role that
    some head carries (labels from `labels` or from classifying the model once)."""
    source = "the labels given" if labels is not None else "classifying the model (default probes)"
    labels = model_labels(loaded, labels)
    results = []
    for role, metric in ROLE_EXPERIMENTS:
        if any(role in names for names in labels.values()):
            result = ablate_heads(loaded, role, metric=metric, seed=seed, progress=progress, control=control,
                                  labels=labels)
            results.append({**result, "chosen_by": f"heads labelled {role} by {source}"})
    return results
