"""Ablation of heads at the right site: z, the input of the output projection.

Zeroing a slice of the attention module's *output* mixes heads (nnsight #525, ACDC PR #82);
a head's own output is z = the input of the output projection (GPT-2 `attn.c_proj`, Llama
`o_proj`, GPT-NeoX `dense`; TransformerLens `hook_z`), reached through the architecture
adapter's `hook_z`. The shared output bias b_O stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.ablation.attribution import attribution_deltas
from headlens.ablation.evalset import bootstrap_ci, build_evalset, check_choice, head_seed
from headlens.ablation.replace import heads_by_layer, layer_replacement, replacements
from headlens.ablation.store import SweepStore
from headlens.ablation.sweep import base_sums, sweep_sums
from headlens.arch import adapter_for
from headlens.capture import Batch, forward
from headlens.errors import HeadlensError
from headlens.heads import Head, all_heads, parse_heads


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


# Measuring an ablation ----------------------------------------------------------------------

SWEEP_COLUMNS = ["layer", "head", "n_tokens", "loss", "loss_ablated", "delta_loss", "ci95_low", "ci95_high"]


def model_label(loaded) -> str:
    return str(loaded.name)


def ablated_sums(model, evalset, heads: Sequence[Head], reps, batch_size: int = 4) -> torch.Tensor:
    """Per-sequence loss sums [n_seq] with `heads` ablated together, by hooks on the full
    forward pass (the plain way: the reference the fast sweep is checked against)."""

    out = []
    n_seq = evalset.input_ids.shape[0]
    with torch.no_grad():
        for start in range(0, n_seq, batch_size):
            rows = slice(start, min(start + batch_size, n_seq))
            replacement = {}
            for head in heads:
                rep = layer_replacement(reps[head.layer], rows)
                if rep is not None:
                    replacement[head] = rep[:, :, head.head]  # [batch | 1, pos, d_head]
            batch = Batch(evalset.input_ids[rows], evalset.mask[rows])
            with ablation_hooks(model, heads, replacement):
                logits = forward(model, batch)  # [batch, pos, d_vocab]
            losses = token_losses(logits, batch.input_ids.to(logits.device), batch.mask.to(logits.device))
            keep = evalset.counted[rows].to(losses.device)
            out.append(torch.where(keep, losses, torch.zeros_like(losses)).sum(-1).cpu())  # [batch]
    return torch.cat(out)


def summarize(base: torch.Tensor, ablated: torch.Tensor, counts: torch.Tensor, seed: int) -> dict:
    """loss, loss_ablated, delta_loss (token-weighted means) and the paired bootstrap CI."""

    n_tokens = int(counts.sum())
    loss = float(base.double().sum() / n_tokens)
    loss_ablated = float(ablated.double().sum() / n_tokens)
    low, high = bootstrap_ci(base, ablated, counts, seed)
    return {"n_tokens": n_tokens, "loss": loss, "loss_ablated": loss_ablated,
            "delta_loss": loss_ablated - loss, "ci95": [low, high]}


def ablate_heads(loaded, heads, method: str = "zero", metric: str = "text", text: str | None = None,
                 seed: int = 0, progress: bool = False) -> dict:
    """Ablate a set of heads together; how much does the metric's loss rise?

    heads: list of Head or a spec string ("3.4,5.1", "layer:3"). Returns a dict with `model`,
    `heads` (["L.H"]), `method`, `metric`, `n_tokens`, `loss`, `loss_ablated`, `delta_loss`
    and `ci95` ([low, high], paired bootstrap over sequences, seeded). See headlens.ablation.evalset
    for the metrics and the evaluation/reference split.
    """

    check_choice(method, metric)
    spec = loaded.spec
    if isinstance(heads, str):
        heads = parse_heads(heads, spec.n_layers, spec.n_heads)
    heads = sorted(Head(*h) for h in heads)
    evalset = build_evalset(loaded, metric, text, seed)
    model = loaded.model
    reps = replacements(model, evalset, method, seed, batch_size=4)
    counts = evalset.counted.sum(1)  # [n_seq]
    base = ablated_sums(model, evalset, [], reps)
    ablated = ablated_sums(model, evalset, heads, reps) if heads else base.clone()
    result = {"model": model_label(loaded), "heads": [str(h) for h in heads], "method": method, "metric": metric}
    result.update(summarize(base, ablated, counts, seed))
    return result


def sweep_heads(loaded, method: str = "zero", metric: str = "text", text: str | None = None, seed: int = 0,
                progress: bool = False, out=None, resume: bool = False, heads=None):
    """Ablate every head alone (or each of `heads`), exactly, with the fast layer-by-layer sweep.

    Returns a DataFrame sorted by (layer, head) with columns `layer`, `head`, `n_tokens`,
    `loss`, `loss_ablated`, `delta_loss`, `ci95_low`, `ci95_high`. With `out` (a directory)
    each finished row is appended durably; `resume=True` continues a sweep found there.
    """


    check_choice(method, metric)
    spec = loaded.spec
    heads = sorted(Head(*h) for h in heads) if heads is not None else all_heads(spec.n_layers, spec.n_heads)
    evalset = build_evalset(loaded, metric, text, seed)
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
        model = loaded.model
        reps = replacements(model, evalset, method, seed, batch_size=4)
        counts = evalset.counted.sum(1)  # [n_seq]
        base = base_sums(model, evalset)

        def on_head(head: Head, sums: torch.Tensor) -> None:
            summary = summarize(base, sums, counts, head_seed(seed, *head))
            low, high = summary.pop("ci95")
            row = {"layer": head.layer, "head": head.head, **summary, "ci95_low": low, "ci95_high": high}
            rows[head] = row
            if store is not None:
                store.append(row)

        bar = _progress_bar(len(todo), progress and distributed.is_main())
        try:
            sweep_sums(model, evalset, heads, reps, on_head, skip=skip, bar=bar)
        finally:
            if bar is not None:
                bar.close()
    for part in distributed.all_gather({h: rows[h] for h in todo}):
        rows.update(part)
    frame = pd.DataFrame([rows[h] for h in heads], columns=SWEEP_COLUMNS)
    frame = frame.sort_values(["layer", "head"], ignore_index=True)
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


def _progress_bar(total: int, progress: bool):
    if not progress:
        return None

    return tqdm(total=total, desc="ablate", unit="head", leave=False)


def approx_sweep(loaded, method: str = "zero", metric: str = "text", text: str | None = None, seed: int = 0):
    """Every single-head ablation delta estimated by attribution patching (one forward and one
    backward per batch; headlens.ablation.attribution). DataFrame: `layer`, `head`, `n_tokens`,
    `delta_loss_approx`, sorted by (layer, head)."""


    check_choice(method, metric)
    evalset = build_evalset(loaded, metric, text, seed)
    reps = replacements(loaded.model, evalset, method, seed, batch_size=4)
    deltas = attribution_deltas(loaded.model, evalset, reps)  # [layer, head]
    rows = [{"layer": layer, "head": head, "n_tokens": evalset.n_tokens,
             "delta_loss_approx": float(deltas[layer, head])}
            for layer in range(deltas.shape[0]) for head in range(deltas.shape[1])]
    return pd.DataFrame(rows)


def agreement(exact, approx) -> dict:
    """Pearson and Spearman correlation of exact `delta_loss` and `delta_loss_approx` per head."""
    merged = exact.merge(approx[["layer", "head", "delta_loss_approx"]], on=["layer", "head"])
    x, y = merged["delta_loss"], merged["delta_loss_approx"]
    return {"pearson": float(x.corr(y)), "spearman": float(x.rank().corr(y.rank())), "n_heads": len(merged)}
