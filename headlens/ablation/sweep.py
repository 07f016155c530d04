"""Exact single-head sweeps without rerunning the whole model per head.

Ablating head h of layer L cannot change anything before layer L's output projection: the
residual stream entering L, L's attention pattern and every other head's z stay as they are.
So the sweep walks the model once, layer by layer; at layer L it keeps the residual stream and
L's attention output, and per head only adds the change of that head's share of c_proj,
(z_h' - z_h) @ W_O[h] (exact: the output projection is linear and its bias stays), then runs L's MLP and
layers L+1.. onward. Several heads share one forward pass as stacked copies of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from headlens.ablation.replace import Replacement, heads_by_layer, layer_replacement
from headlens.ablation.runner import LayerRunner
from headlens.arch import adapter_for
from headlens.devices import is_offloaded, onloaded
from headlens.heads import Head

# Ablations stacked into one forward pass: on CPU stacking did not pay (benchmarks/bench_ablate.py,
# BENCHMARKS.md).
HEADS_PER_PASS = 1
BATCH_SIZE = 4  # evaluation sequences per forward pass


def _batches(n_seq: int, batch_size: int) -> list[slice]:
    return [slice(start, min(start + batch_size, n_seq)) for start in range(0, n_seq, batch_size)]


def base_sums(model, evalset, batch_size: int = BATCH_SIZE) -> torch.Tensor:
    """Per-unit sums of the metric's values for the unablated model, run block by block: [n_units]."""
    total = torch.zeros(evalset.n_units, dtype=torch.float64)  # [n_units]
    with torch.no_grad():
        for rows in _batches(evalset.input_ids.shape[0], batch_size):
            runner = LayerRunner(model, evalset.input_ids[rows], evalset.mask[rows])
            resid = runner.embed()
            for layer in range(runner.n_layers):
                resid = runner.block(layer, resid)
            total += runner.unit_sums(resid, evalset, rows)[0].double().cpu()
    return total


def _ablated_out(attn_out: torch.Tensor, z: torch.Tensor, rep: Replacement, w_o: torch.Tensor,
                 head: Head) -> torch.Tensor:
    """Attention output with head h's z replaced: [batch, pos, d_model]. w_o: [head, d_head, d_model]."""
    z_h = z[:, :, head.head]  # [batch, pos, d_head]
    new = torch.zeros_like(z_h) if rep is None else rep[:, :, head.head].expand_as(z_h)
    return attn_out + (new - z_h) @ w_o[head.head]  # [batch, pos, d_model]


def sweep_sums(model, evalset, heads: Sequence[Head], reps: Sequence[Replacement],
               on_head: Callable[[Head, torch.Tensor], None], skip: set[Head] | frozenset = frozenset(),
               batch_size: int = BATCH_SIZE, heads_per_pass: int = HEADS_PER_PASS, bar=None) -> None:
    """Ablate each head of `heads` alone; call on_head(head, per-unit sums of the metric [n_units]).

    `skip`: heads already done (resume). Groups of `heads_per_pass` heads are fixed by `heads`
    alone, so a resumed sweep stacks the same copies and gives bit-identical rows.
    """
    by_layer = heads_by_layer(sorted(heads))
    pending = {layer for layer, hs in by_layer.items() if any(h not in skip for h in hs)}
    if not pending:
        return
    n_seq = evalset.input_ids.shape[0]
    rows_list = _batches(n_seq, batch_size)
    with torch.no_grad():
        runners = [LayerRunner(model, evalset.input_ids[rows], evalset.mask[rows]) for rows in rows_list]
        states = [runner.embed() for runner in runners]  # residual entering the current layer
        for layer in range(max(pending) + 1):
            attn = [runner.attention(layer, state) for runner, state in zip(runners, states, strict=True)]  # (z, out)
            if layer in pending:
                layer_heads = by_layer[layer]
                for start in range(0, len(layer_heads), heads_per_pass):
                    group = layer_heads[start:start + heads_per_pass]
                    if all(h in skip for h in group):
                        continue
                    sums = _group_sums(model, evalset, runners, rows_list, states, attn, reps[layer], group)
                    for head, head_sums in zip(group, sums, strict=True):
                        if head not in skip:
                            on_head(head, head_sums)
                            if bar is not None:
                                bar.update(1)
            states = [runner.finish_block(layer, state, out)
                      for runner, state, (_, out) in zip(runners, states, attn, strict=True)]


def _group_sums(model, evalset, runners, rows_list, states, attn, rep, group) -> list[torch.Tensor]:
    """Per-unit sums [n_units] for each head of `group`, its ablations stacked as batch copies."""
    total = torch.zeros(len(group), evalset.n_units, dtype=torch.float64)  # [copies, n_units]
    copies = len(group)
    adapter = adapter_for(model)
    with onloaded(adapter.z_module(group[0].layer)):  # a layer accelerate offloaded: its W_O, copied
        w_o = adapter.w_o(group[0].layer)  # [head, d_head, d_model]
        w_o = w_o.clone() if is_offloaded(adapter.z_module(group[0].layer)) else w_o
    for runner, rows, state, (z, out) in zip(runners, rows_list, states, attn, strict=True):
        rep_rows = layer_replacement(rep, rows)
        outs = torch.cat([_ablated_out(out, z, rep_rows, w_o, h) for h in group])  # [copies * batch, pos, d_model]
        resid = state.repeat(copies, 1, 1) if copies > 1 else state  # [copies * batch, pos, d_model]
        final = runner.run_from(group[0].layer, resid, outs, copies=copies)  # [copies * batch, pos, d_model]
        total += runner.unit_sums(final, evalset, rows, copies=copies).double().cpu()
    return list(total)
