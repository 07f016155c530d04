"""Path patching: the exact effect of one sender head on the metric along one edge.

An edge (headlens.circuits.edges) runs from a sender head's write to the residual stream to one
later receiver head's query, key or value input, or to the logits. Its effect (Wang et al. 2022,
arXiv 2211.00593; Goldowsky-Dill et al. 2023, arXiv 2304.05969; the edge patching of ACDC,
Conmy et al. 2023) is the change of the metric when the sender's z is replaced (zero, mean or a
resampled z: headlens.intervene.replace, as `ablate` does; or, with PATCH, the z of the task's
corrupted run at the same position) on that edge alone:
- the sender's write changes by delta = (z' - z) W_O (for a family with a norm on the attention
  output, Gemma 3, the change of that norm's output: norm(out + delta) - norm(out));
- to a receiver r of layer L via q: r's queries are computed from the residual entering L plus
  delta (through L's input norm and the query projection), r's keys and values and every other
  head of L from the clean residual; r's z changes and layers L on run as they do on that
  changed output (its MLP, every later layer: paths from r to the logits are all kept);
- via "direct": delta is added to the final residual stream, then the final norm and the
  unembedding (the norm's scale recomputed, as the model would).
Everything else holds its clean value: the sender's write reaches nothing but that one input.
effect = mean over the scored positions of (metric patched - metric clean), in the metric's units.

Cost: the senders of one receiver are stacked as copies of the batch, so each (receiver, input)
runs layers L.. once per chunk of senders; every edge of a 30-layer model is a long run (edge
attribution, headlens.circuits.attribution, estimates all of them from one backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from headlens.arch import adapter_for, get_module
from headlens.arch.sites import splice_row
from headlens.circuits.edges import DIRECT, LOGITS, VIAS, edge_frame
from headlens.errors import ConfigError
from headlens.heads import Head, all_heads
from headlens.intervene.evalset import BATCH_SIZE, EvalSet
from headlens.intervene.metrics import check_choice
from headlens.intervene.replace import capture_z, layer_replacement, replacements, z_change
from headlens.intervene.sums import unit_sums
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

PATCH = "patch"  # the sender's z from the task's corrupted run (counterfactual_replacements)
COPY_TOKENS = 16_384  # batch positions one stacked pass may hold (copies x batch x pos)


def task_evalset(loaded: LoadedModel, task) -> EvalSet:
    """The evaluation set a task is measured on (an EvalSet is its own)."""
    if isinstance(task, EvalSet):
        return task
    evalset = task.evalset
    return evalset(loaded) if callable(evalset) else evalset


def task_replacements(loaded: LoadedModel, task, method: str, seed: int = 0) -> tuple[EvalSet, list]:
    """The task's evaluation set and what each layer's z becomes under `method` (zero, mean,
    resample: headlens.intervene.replace.replacements, as `ablate` replaces; PATCH: the z of the
    task's corrupted run at the same position, counterfactual_replacements)."""
    evalset = task_evalset(loaded, task)
    if method == PATCH:
        return evalset, counterfactual_replacements(loaded.model, evalset)
    check_choice(method, evalset.metric)
    return evalset, replacements(loaded.model, evalset, method, seed, batch_size=BATCH_SIZE)


def corrupted_ids(evalset: EvalSet) -> torch.Tensor:
    """The corrupted run's tokens in the evaluation set's layout [n_seq, pos] (columns it lacks, such as
    the appended target, taken from the evaluation set: no scored position reads them). ConfigError
    when the set has no corrupted run of its shape."""
    ref = evalset.reference_ids
    if ref is None or ref.shape[0] != len(evalset.input_ids) or ref.shape[1] > evalset.input_ids.shape[1]:
        raise ConfigError(f"{PATCH!r} needs a task with a corrupted run of the same prompts (the ioi task's ABC run)")
    ids = evalset.input_ids.clone()  # [n_seq, pos]
    width = ref.shape[1]
    ids[:, :width] = torch.where(evalset.reference_mask.to(torch.bool), ref, ids[:, :width])
    return ids


def counterfactual_replacements(model, evalset: EvalSet) -> list:
    """Per layer, z of the task's corrupted run at the same (sequence, position): [n_seq, pos, head,
    d_head], interchange (counterfactual) patching as Wang et al. 2022 and the MIB benchmark (Mueller
    et al. 2025) patch from their counterfactual prompts."""
    ids = corrupted_ids(evalset)
    out: list = [None] * adapter_for(model).n_layers

    def keep(layer: int, rows: slice, z: torch.Tensor) -> None:
        if out[layer] is None:
            out[layer] = torch.zeros(*ids.shape, *z.shape[2:], dtype=z.dtype, device=z.device)
        out[layer][rows, : z.shape[1]] = z

    capture_z(model, ids, evalset.mask, BATCH_SIZE, keep)
    return out


def check_vias(via: Sequence[str]) -> tuple[str, ...]:
    """The inputs asked for, checked: ConfigError naming the valid ones."""
    via = (via,) if isinstance(via, str) else tuple(via)
    for name in via:
        if name not in (*VIAS, DIRECT):
            raise ConfigError(f"unknown edge input {name!r}: choose among {', '.join((*VIAS, DIRECT))}")
    return via


def clean_run(adapter, ctx) -> dict:
    """One clean pass of a batch, layer by layer: per layer the residual entering it `resid`
    [batch, pos, d_model], z [batch, pos, head, d_head] and the attention output `out`; `final`
    the residual leaving the last layer."""
    state: dict = {"resid": [], "z": [], "out": []}
    resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
    for layer in range(adapter.n_layers):
        z, out = adapter.attention(layer, resid, ctx)  # [batch, pos, head, d_head], [batch, pos, d_model]
        state["resid"].append(resid)
        state["z"].append(z)
        state["out"].append(out)
        resid = adapter.finish_block(layer, resid, out)
    state["final"] = resid
    return state


def layer_write(adapter, layer: int, out: torch.Tensor) -> torch.Tensor:
    """What `layer`'s attention output `out` [..., d_model] adds to the residual stream (through
    the family's norm on it, where there is one)."""
    norm = adapter.attn_out_norm_module(layer)
    return out if norm is None else norm(out)


def sender_deltas(adapter, state: dict, rep, senders: Sequence[Head], rows: slice) -> torch.Tensor:
    """The change of each sender's write when its z is replaced: [senders, batch, pos, d_model]
    (senders of one layer)."""
    layer = senders[0].layer
    z, out = state["z"][layer], state["out"][layer]  # [batch, pos, head, d_head], [batch, pos, d_model]
    change = z_change(z, layer_replacement(rep, rows, z.shape[1]))  # [batch, pos, head, d_head]
    idx = [s.head for s in senders]
    w_o = adapter.w_o(layer)[idx]  # [senders, d_head, d_model]
    moved = out[None] + torch.einsum("bphd,hdm->hbpm", change[:, :, idx], w_o)  # [senders, batch, pos, d_model]
    return layer_write(adapter, layer, moved) - layer_write(adapter, layer, out)[None]


def _patched_z(adapter, layer: int, state: dict, ctx, deltas: torch.Tensor, via: str) -> torch.Tensor:
    """z of every head of `layer` when its `via` input reads the residual plus each of `deltas`
    [copies, batch, pos, d_model] and its other inputs the clean residual: [copies * batch, pos,
    head, d_head]. The projection's output is spliced (splice_row), so a fused QKV keeps its
    other rows clean."""
    copies = deltas.shape[0]
    block, site = adapter.layer(layer), getattr(adapter.sites, via)
    resid = state["resid"][layer]  # [batch, pos, d_model]
    weight, bias = adapter.qkv_weights(layer)[VIAS.index(via)]  # [heads * d_head, d_model]
    normed = get_module(block, adapter.sites.input_norm)((resid[None] + deltas).flatten(0, 1))  # [c * b, pos, d]
    row = torch.nn.functional.linear(normed, weight, bias)  # [copies * batch, pos, heads * d_head]
    n_row_heads = getattr(adapter, site.split.heads)
    seen: list[torch.Tensor] = []
    with adapter.hooks() as hooks:
        hooks.output(
            get_module(block, site.projection), lambda out: splice_row(out, row, site, n_row_heads, adapter.d_head)
        )
        hooks.z(layer, seen.append)
        get_module(block, adapter.sites.attn)(
            get_module(block, adapter.sites.input_norm)(resid.repeat(copies, 1, 1)), **ctx.attn_kwargs(copies, layer)
        )
    return seen[0]


def _receiver_sums(adapter, evalset, rows, ctx, state, deltas, receivers, via) -> torch.Tensor:
    """Sums of the metric over the batch's scored positions for each (sender copy, receiver):
    [receivers, copies]; receivers of one layer."""
    layer, copies = receivers[0].layer, deltas.shape[0]
    z2 = _patched_z(adapter, layer, state, ctx, deltas, via)  # [copies * batch, pos, head, d_head]
    z, out, resid = state["z"][layer], state["out"][layer], state["resid"][layer]
    w_o = adapter.w_o(layer)  # [head, d_head, d_model]
    sums = []
    for r in receivers:
        dz = z2[:, :, r.head] - z[:, :, r.head].repeat(copies, 1, 1)  # [copies * batch, pos, d_head]
        outs = out.repeat(copies, 1, 1) + dz @ w_o[r.head]  # [copies * batch, pos, d_model]
        final = adapter.run_from(layer, resid.repeat(copies, 1, 1), outs, ctx, copies=copies)
        sums.append(unit_sums(adapter, final, evalset, rows, copies=copies).double().sum(1).cpu())  # [copies]
    return torch.stack(sums)


def patch_edges(
    model,
    evalset,
    reps,
    senders: Sequence[Head],
    receivers: Sequence[Head],
    vias: Sequence[str],
    batch_size: int | None = None,
) -> dict[tuple[Head, str, str], float]:
    """{(sender, receiver "L.H" or "logits", via): effect} for every edge from `senders` to a
    later receiver of `receivers` through each of `vias` (and to the logits with "direct")."""
    adapter = adapter_for(model)
    sums: dict[tuple, float] = {}
    base = 0.0
    senders = sorted(senders)
    with torch.no_grad():
        for rows in evalset.row_batches(batch_size):
            ctx = adapter.context(*evalset.batch(rows))
            state = clean_run(adapter, ctx)
            base += float(unit_sums(adapter, state["final"], evalset, rows).double().sum())
            tokens = int(state["final"].shape[0] * state["final"].shape[1])
            chunk = max(1, COPY_TOKENS // tokens)
            deltas = {}  # sender -> [batch, pos, d_model]
            for layer in sorted({s.layer for s in senders}):
                group = [s for s in senders if s.layer == layer]
                for s, d in zip(group, sender_deltas(adapter, state, reps[layer], group, rows), strict=True):
                    deltas[s] = d
            _add_batch(adapter, evalset, rows, ctx, state, deltas, receivers, vias, chunk, sums)
    return {edge: (total - base) / evalset.n_tokens for edge, total in sums.items()}


def _add_batch(adapter, evalset, rows, ctx, state, deltas, receivers, vias, chunk, sums) -> None:
    """Add one batch's patched metric sums of every edge to `sums`."""
    senders = list(deltas)
    if DIRECT in vias:
        for start in range(0, len(senders), chunk):
            part = senders[start : start + chunk]
            final = state["final"][None] + torch.stack([deltas[s] for s in part])  # [copies, batch, pos, d_model]
            got = unit_sums(adapter, final.flatten(0, 1), evalset, rows, copies=len(part)).double().sum(1)
            for s, value in zip(part, got.tolist(), strict=True):
                sums[(s, LOGITS, DIRECT)] = sums.get((s, LOGITS, DIRECT), 0.0) + value
    for layer in sorted({r.layer for r in receivers}):
        layer_recv = [r for r in receivers if r.layer == layer]
        earlier = [s for s in senders if s.layer < layer]
        for via in (v for v in vias if v != DIRECT):
            for start in range(0, len(earlier), chunk):
                part = earlier[start : start + chunk]
                got = _receiver_sums(
                    adapter, evalset, rows, ctx, state, torch.stack([deltas[s] for s in part]), layer_recv, via
                )  # [receivers, copies]
                for r, values in zip(layer_recv, got.tolist(), strict=True):
                    for s, value in zip(part, values, strict=True):
                        sums[(s, str(r), via)] = sums.get((s, str(r), via), 0.0) + value


def path_patch(
    loaded: LoadedModel,
    task,
    senders: Sequence[Head] | None = None,
    receivers: Sequence[Head] | None = None,
    via: Sequence[str] = (*VIAS, DIRECT),
    method: str = "zero",
    seed: int = 0,
) -> Result:
    """Exact path patching of every edge from `senders` (default: every head) to a later head of
    `receivers` (default: every head) through each input of `via`, and to the logits with
    "direct": a Result of kind "edges" (headlens.results) whose frame is an edge frame with `effect` (metric
    patched - clean, the metric's units), sorted as the edges were enumerated (receiver layer, receiver, via,
    sender); its meta: `model`, `measure` ("effect"), `method`, `metric`, `seed`."""
    vias = check_vias(via)
    spec = loaded.spec
    heads = all_heads(spec.n_layers, spec.n_heads)
    evalset, reps = task_replacements(loaded, task, method, seed)
    effects = patch_edges(loaded.model, evalset, reps, senders or heads, receivers or heads, vias)
    keys = list(effects)
    frame = edge_frame(
        [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], effect=np.array([effects[k] for k in keys])
    )
    meta = {"model": str(loaded.name), "measure": "effect", "method": method, "metric": evalset.metric, "seed": seed}
    return Result("edges", frame, meta)
