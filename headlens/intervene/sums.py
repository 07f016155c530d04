"""Exact ablation sums: a set of heads ablated together, and every head alone without rerunning the
whole model per head.

- `ablated_sums`: the heads' z replaced by hooks on the full forward pass of the base model (the
  plain way: the reference the fast sweep is checked against);
- `sweep_sums`: ablating head h of layer L cannot change anything before layer L's output
  projection: the residual stream entering L, L's attention pattern and every other head's z stay
  as they are. So the sweep walks the model once, layer by layer; at layer L it keeps the residual
  stream and L's attention output, and per head only adds the change of that head's share of the
  output projection, (z_h' - z_h) @ W_O[h] (exact: the projection is linear and its bias stays),
  then runs L's MLP and layers L+1.. onward. Several heads share one forward pass as stacked copies
  of the batch.
Layers run through the architecture adapter (headlens.arch): the same modules and attention as
`model(...)`, with the causal + padding mask built by transformers' own mask functions, so a split
run reproduces the full forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from headlens import distributed
from headlens.arch import adapter_for
from headlens.arch.kernels import no_pattern_kernels
from headlens.heads import Head
from headlens.intervene.evalset import BATCH_SIZE, BATCH_TOKENS
from headlens.intervene.metrics import position_values
from headlens.intervene.replace import Replacement, ablation_hooks, heads_by_layer, layer_replacement, z_change
from headlens.load.devices import is_offloaded, onloaded


def scored_values(
    hidden: torch.Tensor, lm_head, evalset, rows: slice, seq: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """The metric's value at scored pairs (seq, pos) of the batch `rows`: [..., n_scored];
    hidden [..., n_scored, d_model] after the final norm. The target is token pos + 1."""
    device = hidden.device
    targets = evalset.input_ids[rows].to(device)[seq, pos + 1]  # [n_scored]
    foils = None if evalset.foils is None else evalset.foils[rows].to(device)[seq, pos]  # [n_scored]
    return position_values(hidden, lm_head, targets, foils, evalset.kind)


def resid_values(adapter, resid: torch.Tensor, evalset, rows: slice, copies: int = 1) -> torch.Tensor:
    """The metric's value at each scored position of the batch `rows` (row-major) from the final
    residual of `copies` stacked copies of the batch: [copies, n_scored].

    Only scored positions go through the final norm and the unembedding (both act per position,
    so this is exact): the repeat metric scores under half of them.
    """
    keep = evalset.counted[rows].to(resid.device)  # [batch, pos-1]
    seq, pos = torch.nonzero(keep, as_tuple=True)  # scored (sequence, position) pairs
    picked = resid.view(copies, -1, *resid.shape[1:])[:, seq, pos]  # [copies, n_scored, d_model]
    hidden = adapter.final_norm()(picked)  # [copies, n_scored, d_model]
    return scored_values(hidden, adapter.unembed(), evalset, rows, seq, pos)  # [copies, n_scored]


def unit_sums(adapter, resid: torch.Tensor, evalset, rows: slice, copies: int = 1) -> torch.Tensor:
    """Sums of the metric's values over each bootstrap unit from the final residual of `copies`
    stacked copies of the batch `rows` of `evalset`: [copies, n_units] (resid_values, summed)."""
    values = resid_values(adapter, resid, evalset, rows, copies)  # [copies, n_scored]
    units = evalset.units[rows][evalset.counted[rows]].to(values.device)  # [n_scored]
    sums = torch.zeros(copies, evalset.n_units, dtype=values.dtype, device=values.device)  # [copies, n_units]
    return sums.index_add_(1, units, values)


def base_sums(model, evalset, batch_size: int | None = BATCH_SIZE) -> torch.Tensor:
    """Per-unit sums of the metric's values for the unablated model, run block by block: [n_units]."""
    adapter = adapter_for(model)
    total = torch.zeros(evalset.n_units, dtype=torch.float64)  # [n_units]
    with torch.no_grad(), no_pattern_kernels(model):
        for rows in evalset.row_batches(batch_size):
            ctx = adapter.context(*evalset.batch(rows))
            resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
            for layer in range(adapter.n_layers):
                resid = adapter.block(layer, resid, ctx)
            total += unit_sums(adapter, resid, evalset, rows)[0].double().cpu()
    return total


def stack_count(evalset, batch_size: int | None = BATCH_SIZE) -> int:
    """Heads of a layer whose ablations one pass stacks as copies of the batch: as many copies of the
    widest pass (sequences x positions) as BATCH_TOKENS rows hold, at least one. A stacked pass so
    holds the activations of a default batch at most, and a short evaluation set (128 tokens: 9
    heads in 2 passes instead of 9) runs matrix products of ~1,000 rows, at the rate of full ones,
    with the per-pass costs (hooks, calls, the metric's reductions) paid per pass, not per head."""
    widest = max(evalset.batch(rows)[0].numel() for rows in evalset.row_batches(batch_size))
    return max(1, BATCH_TOKENS // max(1, widest))


def head_groups(heads: Sequence[Head], per_pass: int) -> list[list[Head]]:
    """The heads each pass stacks: `heads` by layer, each layer's in the fewest passes of at most
    `per_pass` heads, their sizes as even as can be (9 heads at 8 a pass: 5 and 4)."""
    groups = []
    for layer_heads in heads_by_layer(sorted(heads)).values():
        passes = -(-len(layer_heads) // per_pass)  # ceil
        size = -(-len(layer_heads) // passes)
        groups += [layer_heads[start : start + size] for start in range(0, len(layer_heads), size)]
    return groups


def sweep_sums(
    model,
    evalset,
    heads: Sequence[Head],
    reps: Sequence[Replacement],
    on_head: Callable[[Head, torch.Tensor], None],
    skip: set[Head] | frozenset = frozenset(),
    batch_size: int | None = BATCH_SIZE,
    heads_per_pass: int | None = None,
    bar=None,
) -> None:
    """Ablate each head of `heads` alone; call on_head(head, per-unit sums of the metric [n_units]).

    `heads_per_pass` heads of a layer are stacked in one pass (None: `stack_count`). `skip`: heads
    already done (resume). The groups are fixed by `heads` alone (head_groups), so a resumed sweep
    stacks the same copies and gives bit-identical rows.
    """
    per_pass = stack_count(evalset, batch_size) if heads_per_pass is None else heads_per_pass
    groups = [g for g in head_groups(heads, per_pass) if any(h not in skip for h in g)]
    if not groups:
        return
    adapter = adapter_for(model)
    rows_list = evalset.row_batches(batch_size)
    with torch.no_grad(), no_pattern_kernels(model):
        ctxs = [adapter.context(*evalset.batch(rows)) for rows in rows_list]
        states = [adapter.embed_tokens(ctx) for ctx in ctxs]  # residual entering the current layer
        last = groups[-1][0].layer
        for layer in range(last + 1):
            attn = [adapter.attention(layer, state, ctx) for ctx, state in zip(ctxs, states, strict=True)]  # (z, out)
            for group in (g for g in groups if g[0].layer == layer):
                sums = _group_sums(adapter, evalset, ctxs, rows_list, states, attn, reps[layer], group)
                for head, head_sums in zip(group, sums, strict=True):
                    if head not in skip:
                        on_head(head, head_sums)
                        if bar is not None:
                            bar.update(1)
            if layer < last:  # the residual entering the next layer
                states = [adapter.finish_block(layer, s, out) for s, (_, out) in zip(states, attn, strict=True)]


def _ablated_out(
    attn_out: torch.Tensor, z: torch.Tensor, rep: Replacement, w_o: torch.Tensor, head: Head
) -> torch.Tensor:
    """Attention output with head h's z replaced: [batch, pos, d_model]. w_o: [head, d_head, d_model]."""
    rep_h = None if rep is None else rep[:, :, head.head]  # [batch | 1, pos | 1, d_head]
    return attn_out + z_change(z[:, :, head.head], rep_h) @ w_o[head.head]  # [batch, pos, d_model]


def _group_sums(adapter, evalset, ctxs, rows_list, states, attn, rep, group) -> list[torch.Tensor]:
    """Per-unit sums [n_units] for each head of `group`, its ablations stacked as batch copies."""
    total = torch.zeros(len(group), evalset.n_units, dtype=torch.float64)  # [copies, n_units]
    copies = len(group)
    layer = group[0].layer
    with onloaded(adapter.z_module(layer)):  # a layer accelerate offloaded: its W_O, copied
        w_o = adapter.w_o(layer)  # [head, d_head, d_model]
        w_o = w_o.clone() if is_offloaded(adapter.z_module(layer)) else w_o
    for ctx, rows, state, (z, out) in zip(ctxs, rows_list, states, attn, strict=True):
        rep_rows = layer_replacement(rep, rows, state.shape[1])
        outs = torch.cat([_ablated_out(out, z, rep_rows, w_o, h) for h in group])  # [copies * batch, pos, d_model]
        resid = state.repeat(copies, 1, 1) if copies > 1 else state  # [copies * batch, pos, d_model]
        final = adapter.run_from(layer, resid, outs, ctx, copies=copies)  # [copies * batch, pos, d_model]
        total += unit_sums(adapter, final, evalset, rows, copies=copies).double().cpu()
    return list(total)


def ablated_hidden(model, evalset, rows: slice, heads: Sequence[Head], reps) -> torch.Tensor:
    """The final hidden states (final norm applied) of the sequences `rows` of `evalset` with `heads`
    ablated by hooks on the full forward pass: [batch, width, d_model] (width: EvalSet.batch)."""
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in evalset.batch(rows))  # [batch, width]
    replacement = {}
    for head in heads:
        rep = layer_replacement(reps[head.layer], rows, ids.shape[1])
        if rep is not None:
            replacement[head] = rep[:, :, head.head]  # [batch | 1, pos | 1, d_head]
    with ablation_hooks(model, heads, replacement):
        return adapter.run_trunk(ids, mask)  # [batch, width, d_model], final norm applied


def ablated_sums(
    model, evalset, heads: Sequence[Head], reps, batch_size: int | None = BATCH_SIZE, shard_batches: bool = False
) -> torch.Tensor:
    """Per-unit sums of the metric [n_units] with `heads` ablated together, by hooks on the
    full forward pass of the base model.

    `shard_batches` (a collective: every rank must call it with the same arguments): each rank runs
    every world_size-th batch and the batches' sums are added in batch order on every rank, so the
    result equals one process's exactly."""
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    total = torch.zeros(evalset.n_units, dtype=torch.float64)  # [n_units]
    indexed = enumerate(evalset.row_batches(batch_size))
    parts = {}  # batch index -> (first unit, its sums over its units) when sharded
    with torch.no_grad():
        for index, rows in distributed.shard(indexed) if shard_batches else indexed:
            hidden = ablated_hidden(model, evalset, rows, heads, reps)  # [batch, width, d_model]
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
