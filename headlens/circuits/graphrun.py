"""One forward pass of the model's graph (headlens.circuits.graph) with every input built edge by edge.

Each receiver's input is the sum of its senders' outputs, each taken from the running pass if the
edge is in the circuit and from the reference (the counterfactual run, or the mean over the task's
sequences) otherwise: the edge patching of EAP-IG's `evaluate_graph` (Hanna et al. 2024) and MIB.
Two equal ways to build it, chosen per receiver for the fewer terms:
- x = resid + sum over edges out of the circuit of (reference_s - out_s), resid the running residual;
- x = reference input + sum over edges in the circuit of (out_s - reference_s).
The full circuit so runs the clean model exactly, the empty one the reference run exactly.

A head's q, k and v inputs are separate residual streams: each goes through the layer's input norm
and the head's own slice of the projection; the rows, spliced into the projection modules' output
layout (headlens.arch.sites.splice_row), stand in for those modules while the layer's own attention
module runs (its output projection replaced by a stand-in that keeps z), so nothing is projected twice.
In the plain model's pass that EAP differentiates, every input of a layer's heads is the residual
itself: it is normed once and the gradients are taken after the norm (then carried through the norm's
vector-Jacobian product, headlens.circuits.faithfulness.head_input_grads), rather than running
3 x head copies through the norm and keeping them for the backward pass.
Without a Record, blocks whose inputs are all the reference's are not run (`run_graph`). With grouped
key/value heads (GQA), query head h's key and value come from copy h mod g of g stacked copies of
the batch, each copy carrying the keys and values its query heads' inputs give. A head's output is
z_h W_O[h]; where the family normalises the attention output (Gemma 3) the norm's scale, computed
on the whole layer's output, multiplies each head's share (their sum is the norm's output).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from headlens.arch import get_module
from headlens.arch.sites import splice_row
from headlens.circuits.edges import VIAS


@dataclass
class Record:
    """Every sender's output [senders, batch, pos, d_model] and each receiver block's input as the
    pass built it: `attn_in` [layer] and `mlp_in` [layer] (the residual they read), `final`."""

    outs: torch.Tensor | None
    attn_in: list = field(default_factory=list)
    mlp_in: list = field(default_factory=list)
    final: torch.Tensor | None = None


class _Given(nn.Module):
    """A stand-in for a projection module whose output is already known: returns it, computing nothing."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.value


class _Capture(nn.Module):
    """A stand-in for the output projection: keeps its input (z) and returns zeros of width `width`."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.seen = width, None

    def forward(self, merged: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.seen = merged  # [batch, pos, head * d_head]
        return merged.new_zeros(*merged.shape[:-1], self.width)


@contextlib.contextmanager
def swapped(root: nn.Module, modules: dict):
    """`root`'s submodules at the paths of `modules` replaced by the modules given, restored on exit."""
    saved = []
    try:
        for path, module in modules.items():
            parent_path, _, name = path.rpartition(".")
            parent = get_module(root, parent_path)
            saved.append((parent, name, getattr(parent, name)))
            setattr(parent, name, module)
        yield
    finally:
        for parent, name, module in reversed(saved):
            setattr(parent, name, module)


def _rows(adapter, layer: int, normed: torch.Tensor, copies: int) -> dict:
    """Each of q, k, v's projection rows [copies * batch, pos, row * d_head] when head h's query, key
    and value read normed[0, h], normed[1, h], normed[2, h] (normed [3, head, batch, pos, d_model]);
    copy c of a key/value row j carries the input of query head j * copies + c."""
    n_heads, d_head, rows = adapter.n_heads, adapter.d_head, {}
    for index, via in enumerate(VIAS):
        weight, bias = adapter.qkv_weights(layer)[index]  # [n_row * d_head, d_model]
        n_row = n_heads if via == "q" else adapter.n_kv_heads
        w = weight.view(n_row, d_head, -1)  # [row, d_head, d_model]
        if via == "q":
            src = normed[0][None]  # [1, head, batch, pos, d_model]
        else:  # a view: [copies, row, batch, pos, d_model]
            src = normed[index].view(n_row, copies, *normed.shape[2:]).transpose(0, 1)
        row = torch.einsum("crbpm,rdm->cbprd", src, w).flatten(-2)  # [c, batch, pos, row * d_head]
        row = row if bias is None else row + bias
        rows[via] = row.expand(copies, *row.shape[1:]).flatten(0, 1)  # [copies * batch, pos, row * d_head]
    return rows


def _projection_outputs(adapter, rows: dict) -> dict:
    """Each q/k/v projection module's output (path -> [copies * batch, pos, out]) holding `rows`:
    every part of it is one of the rows, spliced in its layout (headlens.arch.sites.splice_row)."""
    out = {}
    for via in VIAS:
        site = getattr(adapter.sites, via)
        out.setdefault(site.projection, []).append((site, rows[via]))
    for path, parts in out.items():
        width = sum(row.shape[-1] for _, row in parts)
        value = parts[0][1].new_empty(*parts[0][1].shape[:-1], width)  # [copies * batch, pos, out]
        for site, row in parts:
            value = splice_row(value, row, site, getattr(adapter, site.split.heads), adapter.d_head)
        out[path] = value
    return out


def split_attention(adapter, layer: int, normed: torch.Tensor, ctx) -> torch.Tensor:
    """z [batch, pos, head, d_head] of `layer` when head h's query, key and value read normed[0, h],
    normed[1, h], normed[2, h] (normed [3, head, batch, pos, d_model], after the layer's input norm).
    The layer's attention module runs with its q/k/v projections replaced by their known outputs and
    its output projection by a stand-in that keeps z, so no projection is computed twice."""
    block, n_heads = adapter.layer(layer), adapter.n_heads
    copies, batch = n_heads // adapter.n_kv_heads, normed.shape[2]
    stand_ins = {
        path: _Given(value)
        for path, value in _projection_outputs(adapter, _rows(adapter, layer, normed, copies)).items()
    }
    capture = _Capture(normed.shape[-1])
    attn_path = adapter.sites.attn
    z_path = adapter.sites.z.module
    with swapped(block, {**stand_ins, z_path: capture}):
        dummy = normed[0, 0].repeat(copies, 1, 1)  # [copies * batch, pos, d_model]: only its shape is read
        get_module(block, attn_path)(dummy, **ctx.attn_kwargs(copies, layer))
    merged = capture.seen  # [copies * batch, pos, head * d_head]
    z = merged.view(copies, batch, merged.shape[1], n_heads, -1)  # [copies, batch, pos, head, d_head]
    heads = torch.arange(n_heads)
    return z[heads % copies, :, :, heads].permute(1, 2, 0, 3)  # [batch, pos, head, d_head]


def head_writes(adapter, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's write to the residual stream [head, batch, pos, d_model] and the layer's whole
    attention write [batch, pos, d_model] (output projection, bias, and the family's norm on it)."""
    w_o = adapter.w_o(layer)  # [head, d_head, d_model]
    per_head = torch.einsum("bphd,hdm->hbpm", z, w_o)  # [head, batch, pos, d_model]
    out = adapter.z_module(layer)(z.flatten(-2))  # [batch, pos, d_model]
    norm = adapter.attn_out_norm_module(layer)
    if norm is None:
        return per_head, out
    scale = torch.rsqrt(out.float().pow(2).mean(-1, keepdim=True) + norm.eps)  # [batch, pos, 1]
    return per_head * (scale * adapter.attn_out_gain(layer)).to(per_head.dtype), norm(out)


def mlp_write(adapter, layer: int, x: torch.Tensor) -> torch.Tensor:
    """What `layer`'s MLP adds to the residual stream when it reads x [..., d_model]."""
    block = adapter.layer(layer)
    out = get_module(block, adapter.sites.mlp)(get_module(block, adapter.sites.post_norm)(x))
    out_norm = getattr(adapter, "mlp_out_norm", None)  # Gemma 3 normalises the MLP's output
    return out if out_norm is None else get_module(block, out_norm)(out)


def _edge_sum(mask: torch.Tensor, diffs: torch.Tensor) -> torch.Tensor:
    """sum over senders s of mask[s, r] * diffs[s]: [receivers, *diffs.shape[1:]] (mask [senders,
    receivers] bool, diffs [senders, ...]); only the senders with an edge in `mask` are read."""
    rows = mask.any(1)  # [senders]
    n_rows = int(rows.sum())
    if n_rows < mask.shape[0] // 2:  # few senders: gather them
        index = rows.nonzero().flatten()
        mask, diffs = mask[index], diffs[index]
    terms = mask.to(diffs.dtype).T @ diffs.flatten(1)  # [receivers, rest]
    return terms.view(mask.shape[1], *diffs.shape[1:])


def build_inputs(resid, site_ref, diffs, keep) -> torch.Tensor:
    """Inputs of a block of receivers [receivers, batch, pos, d_model] from the running residual
    `resid`, the reference inputs `site_ref` (None: no reference, every edge in), the running
    senders' diffs (out - reference) [senders, batch, pos, d_model] and keep [senders, receivers].
    Each receiver takes the form with fewer terms (module docstring)."""
    n_recv = keep.shape[1]
    outside = ~keep
    n_out, n_in = outside.sum(0), keep.sum(0)  # [receivers]
    via_resid = torch.ones_like(n_out, dtype=torch.bool) if site_ref is None else n_out <= n_in  # [receivers]
    x = torch.empty(n_recv, *resid.shape, dtype=resid.dtype)  # [receivers, batch, pos, d_model]
    for use_resid, base, mask, sign in ((True, resid, outside, -1.0), (False, site_ref, keep, 1.0)):
        cols = (via_resid == use_resid).nonzero().flatten()  # [cols]
        if len(cols) == 0:
            continue
        block = mask[:, cols]  # [senders, cols]
        if not bool(block.any()):
            x[cols] = base
        elif sign < 0:
            x[cols] = base - _edge_sum(block, diffs)
        else:
            x[cols] = base + _edge_sum(block, diffs)
    return x


def _last_resid_block(graph, keep: torch.Tensor) -> int:
    """The last receiver block (attention of layer L: 2L, its MLP: 2L + 1, the logits: 2 n_layers)
    with a receiver built from the running residual (more edges in the circuit than out); -1: none."""
    keep = keep & graph.real
    n_in, n_out = keep.sum(0), (graph.real & ~keep).sum(0)  # [receivers]
    used = graph.receiver_block[n_out <= n_in]
    return int(used.max()) if len(used) else -1


def run_graph(
    adapter,
    graph,
    ctx,
    keep,
    ref: Record | None = None,
    probes: dict | None = None,
    embed=None,
    record: bool = True,
    start: tuple[int, Record] | None = None,
):
    """The final input of the logits [batch, pos, d_model] and the pass's Record, for circuit `keep`
    [senders, receivers] bool against reference `ref` (None: the plain model). `probes`, if given (the
    plain model's pass only: `keep` the whole graph, no `ref`, no `start`), gets what each receiver block
    reads, requiring grad: per layer the heads' q, k and v inputs after the layer's input norm ("attn"
    [layer], [3, head, batch, pos, d_model], every input the residual "attn_x" [layer] normed once),
    the MLP's input ("mlp" [layer]) and the logits' ("final"); `embed` replaces the embeddings;
    `record` False leaves the Record's outputs and inputs out (None). Without a Record, a block whose
    inputs are all the reference's (no edge in the circuit from a sender that differs from it) is not
    run: its outputs are the reference's, diffs 0, wherever no later input is built from the running
    residual. `start` (layer, clean Record of the plain model's pass): the pass begins at that layer
    from the clean run's residual and outputs, exact where every edge into an earlier receiver is in
    `keep`."""
    first_layer = 0 if start is None else start[0]
    if first_layer:
        resid = start[1].attn_in[first_layer]  # [batch, pos, d_model]
    else:
        resid = adapter.embed_tokens(ctx) if embed is None else embed  # [batch, pos, d_model]
    if probes is not None:  # every later input depends on it, so each requires grad
        resid = resid.detach().requires_grad_(True)
    n_heads = adapter.n_heads
    shape = (graph.n_senders, *resid.shape)
    record = Record(torch.empty(shape, dtype=resid.dtype) if record else None)
    outs = record.outs  # [senders, batch, pos, d_model] or None
    diffs = None if ref is None else torch.empty(shape, dtype=resid.dtype)  # [senders, batch, pos, d_model]
    may_skip = ref is not None and outs is None and probes is None
    last_resid = _last_resid_block(graph, keep) if may_skip else 2 * graph.n_layers
    moved = torch.zeros(graph.n_senders, dtype=torch.bool)  # [senders]: output differs from the reference's

    def keep_out(senders, value):
        if outs is not None:
            outs[senders] = value.detach() if probes is not None else value
        if diffs is not None:
            diffs[senders] = value - ref.outs[senders]

    def skip(block, receivers, senders) -> bool:
        """True (and the senders' diffs set to 0) when `block` need not run."""
        n_up = graph.upstream(receivers[0])
        if may_skip and block > last_resid and not bool((keep[:n_up, receivers] & moved[:n_up, None]).any()):
            diffs[senders] = 0.0
            return True
        moved[senders] = True
        return False

    def inputs(receivers, base, site_ref, key):
        n_up = graph.upstream(receivers[0])
        block = keep[:n_up, receivers]
        x = build_inputs(base, site_ref, None if diffs is None else diffs[:n_up], block)
        if probes is not None:
            probes[key].append(x)
        return x  # [receivers, batch, pos, d_model]

    if first_layer:
        done = graph.head_sender(first_layer, 0)  # the senders before the layer: the clean run's outputs
        keep_out(slice(0, done), start[1].outs[:done])
        moved[:done] = True
    else:
        keep_out(0, resid)
        moved[0] = True
    for layer in range(first_layer, adapter.n_layers):
        if outs is not None:
            record.attn_in.append(resid)
        first = graph.head_receiver(layer, 0, "q")
        receivers = list(range(first, first + 3 * n_heads))
        heads = slice(graph.head_sender(layer, 0), graph.head_sender(layer, 0) + n_heads)
        mid, write = resid, None  # a block not run leaves the residual stale: no later input reads it
        if not skip(2 * layer, receivers, heads):
            norm = get_module(adapter.layer(layer), adapter.sites.input_norm)
            if probes is None:
                x = inputs(receivers, resid, _ref(ref, "attn_in", layer), "attn")
                normed = norm(x.view(3, n_heads, *resid.shape))  # [3, head, batch, pos, d_model]
            else:  # the plain pass: every input of the layer's heads is `resid`, normed once
                normed = norm(resid).expand(3, n_heads, *resid.shape)  # [3, head, batch, pos, d_model]
                probes["attn"].append(normed)
                probes["attn_x"].append(resid.detach())
            z = split_attention(adapter, layer, normed, ctx)  # [batch, pos, head, d_head]
            per_head, write = head_writes(adapter, layer, z)
            keep_out(heads, per_head)
            mid = resid + write if not adapter.parallel_residual else resid
        if outs is not None:
            record.mlp_in.append(mid)
        if not skip(2 * layer + 1, [graph.mlp_receiver(layer)], graph.mlp_sender(layer)):
            mlp_x = inputs([graph.mlp_receiver(layer)], mid, _ref(ref, "mlp_in", layer), "mlp")[
                0
            ]  # [batch, pos, d_model]
            mlp_out = mlp_write(adapter, layer, mlp_x)
            keep_out(graph.mlp_sender(layer), mlp_out)
            if not adapter.parallel_residual:
                resid = mid + mlp_out
            elif write is not None:
                resid = mlp_out + write + resid
    record.final = resid
    return inputs([graph.logits_receiver], resid, None if ref is None else ref.final, "final")[0], record


def _ref(ref: Record | None, name: str, layer: int):
    return None if ref is None else getattr(ref, name)[layer]
