"""One forward pass of the model's graph (headlens.circuits.graph) with every input built edge by edge.

Each receiver's input is the sum of its senders' outputs, each taken from the running pass if the
edge is in the circuit and from the reference (the counterfactual run, or the mean over the task's
sequences) otherwise: the edge patching of EAP-IG's `evaluate_graph` (Hanna et al. 2024) and MIB.
Two equal ways to build it, chosen per block of receivers for the fewer terms:
- x = resid + sum over edges out of the circuit of (reference_s - out_s), resid the running residual;
- x = reference input + sum over edges in the circuit of (out_s - reference_s).
The full circuit so runs the clean model exactly, the empty one the reference run exactly.

A head's q, k and v inputs are separate residual streams: each goes through the layer's input norm
and the head's own slice of the projection; the rows are spliced into the projection modules'
outputs (headlens.arch.sites.splice_row) and the layer's own attention module runs. With grouped
key/value heads (GQA), query head h's key and value come from copy h mod g of g stacked copies of
the batch, each copy carrying the keys and values its query heads' inputs give. A head's output is
z_h W_O[h]; where the family normalises the attention output (Gemma 3) the norm's scale, computed
on the whole layer's output, multiplies each head's share (their sum is the norm's output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headlens.arch import get_module
from headlens.arch.sites import splice_row
from headlens.circuits.edges import VIAS


@dataclass
class Record:
    """Every sender's output [senders, batch, pos, d_model] and each receiver block's input as the
    pass built it: `attn_in` [layer] and `mlp_in` [layer] (the residual they read), `final`."""

    outs: torch.Tensor
    attn_in: list = field(default_factory=list)
    mlp_in: list = field(default_factory=list)
    final: torch.Tensor | None = None


def split_attention(adapter, layer: int, x: torch.Tensor, ctx) -> torch.Tensor:
    """z [batch, pos, head, d_head] of `layer` when head h's query, key and value read x[0, h],
    x[1, h], x[2, h] (x [3, head, batch, pos, d_model])."""
    block, n_heads, d_head = adapter.layer(layer), adapter.n_heads, adapter.d_head
    copies, batch = n_heads // adapter.n_kv_heads, x.shape[2]
    normed = get_module(block, adapter.sites.input_norm)(x)  # [3, head, batch, pos, d_model]
    rows = {}
    for index, via in enumerate(VIAS):
        weight, bias = adapter.qkv_weights(layer)[index]  # [n_row * d_head, d_model]
        n_row = n_heads if via == "q" else adapter.n_kv_heads
        w = weight.view(n_row, d_head, -1)  # [row, d_head, d_model]
        if via == "q":
            src = normed[0][None]  # [1, head, batch, pos, d_model]
        else:  # copy c: kv head j reads the input of query head j * copies + c
            src = torch.stack([normed[index][c::copies] for c in range(copies)])  # [copies, row, batch, pos, d]
        row = torch.einsum("crbpm,rdm->cbprd", src, w).flatten(-2)  # [c, batch, pos, row * d_head]
        row = row if bias is None else row + bias
        rows[via] = row.expand(copies, *row.shape[1:]).flatten(0, 1)  # [copies * batch, pos, row * d_head]
    seen: list[torch.Tensor] = []

    def splicer(path):
        def splice(out):
            for via in VIAS:
                site = getattr(adapter.sites, via)
                if site.projection == path:
                    out = splice_row(out, rows[via], site, getattr(adapter, site.split.heads), d_head)
            return out

        return splice

    with adapter.hooks() as hooks:
        for path in dict.fromkeys(getattr(adapter.sites, via).projection for via in VIAS):
            hooks.output(get_module(block, path), splicer(path))
        hooks.z(layer, seen.append)
        dummy = normed[0, 0].repeat(copies, 1, 1)  # [copies * batch, pos, d_model]: its rows are replaced
        get_module(block, adapter.sites.attn)(dummy, **ctx.attn_kwargs(copies, layer))
    z = seen[0].view(copies, batch, *seen[0].shape[1:])  # [copies, batch, pos, head, d_head]
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


def build_inputs(resid, site_ref, diffs, keep) -> torch.Tensor:
    """Inputs of a block of receivers [receivers, batch, pos, d_model] from the running residual
    `resid`, the reference inputs `site_ref` (None: no reference, every edge in), the running
    senders' diffs (out - reference) [senders, batch, pos, d_model] and keep [senders, receivers]."""
    n_recv = keep.shape[1]
    outside = ~keep
    if site_ref is None or int(outside.sum()) <= int(keep.sum()):
        rows = outside.any(1)
        if not bool(rows.any()):
            return resid.expand(n_recv, *resid.shape)
        terms = torch.einsum("sr,sx->rx", outside[rows].to(diffs.dtype), diffs[rows].flatten(1))
        return resid - terms.view(n_recv, *resid.shape)
    rows = keep.any(1)
    if not bool(rows.any()):
        return site_ref.expand(n_recv, *site_ref.shape)
    terms = torch.einsum("sr,sx->rx", keep[rows].to(diffs.dtype), diffs[rows].flatten(1))
    return site_ref + terms.view(n_recv, *site_ref.shape)


def run_graph(adapter, graph, ctx, keep, ref: Record | None = None, probes: dict | None = None, embed=None):
    """The final input of the logits [batch, pos, d_model] and the pass's Record, for circuit `keep`
    [senders, receivers] bool against reference `ref` (None: the plain model). `probes`, if given, gets
    a zero tensor requiring grad added to each receiver block's inputs ("attn" [layer], "mlp"
    [layer], "final"); `embed` replaces the embeddings."""
    resid = adapter.embed_tokens(ctx) if embed is None else embed  # [batch, pos, d_model]
    n_heads = adapter.n_heads
    outs = torch.empty(graph.n_senders, *resid.shape, dtype=resid.dtype)  # [senders, batch, pos, d_model]
    record = Record(outs)
    outs[0] = resid.detach() if probes is not None else resid
    diffs = None if ref is None else torch.zeros_like(outs)  # [senders, batch, pos, d_model]
    if diffs is not None:
        diffs[0] = resid - ref.outs[0]

    def inputs(receivers, base, site_ref, key):
        n_up = graph.upstream(receivers[0])
        block = keep[:n_up, receivers]
        x = build_inputs(base, site_ref, None if diffs is None else diffs[:n_up], block)
        if probes is not None:
            probes[key].append(torch.zeros_like(x, requires_grad=True))
            x = x + probes[key][-1]
        return x  # [receivers, batch, pos, d_model]

    for layer in range(adapter.n_layers):
        record.attn_in.append(resid)
        first = graph.head_receiver(layer, 0, "q")
        x = inputs(list(range(first, first + 3 * n_heads)), resid, _ref(ref, "attn_in", layer), "attn")
        z = split_attention(adapter, layer, x.view(3, n_heads, *resid.shape), ctx)  # [batch, pos, head, d_head]
        per_head, write = head_writes(adapter, layer, z)
        senders = slice(graph.head_sender(layer, 0), graph.head_sender(layer, 0) + n_heads)
        outs[senders] = per_head.detach() if probes is not None else per_head
        if diffs is not None:
            diffs[senders] = per_head - ref.outs[senders]
        mid = resid + write if not adapter.parallel_residual else resid
        record.mlp_in.append(mid)
        mlp_x = inputs([graph.mlp_receiver(layer)], mid, _ref(ref, "mlp_in", layer), "mlp")[0]  # [batch, pos, d_model]
        mlp_out = mlp_write(adapter, layer, mlp_x)
        sender = graph.mlp_sender(layer)
        outs[sender] = mlp_out.detach() if probes is not None else mlp_out
        if diffs is not None:
            diffs[sender] = mlp_out - ref.outs[sender]
        resid = mid + mlp_out if not adapter.parallel_residual else mlp_out + write + resid
    record.final = resid
    return inputs([graph.logits_receiver], resid, None if ref is None else ref.final, "final")[0], record


def _ref(ref: Record | None, name: str, layer: int):
    return None if ref is None else getattr(ref, name)[layer]
