"""EAP*: edge attribution with each receiver's attention recomputed exactly.

EAP (headlens.circuits.attribution) linearises an edge's whole path at the clean run: the sender's
write change delta_s through the receiver's input norm, its query, key or value projection, its
softmax and everything after its z. The softmax is where linearisation fails worst: a change of
queries or keys moves a saturated pattern far more, or far less, than its gradient says. AtP*
(Kramar et al. 2024, arXiv 2403.00745) fixes this for node attribution by recomputing the attention
pattern exactly and linearising only from there (the QK fix, headlens.ablation.gradients.atp_star_deltas);
EAP* does the same per edge:

    attribution(s -> r.via) = dM/dz_r . (z_r(x + delta_s on r's via input) - z_r(x))

the first factor the gradient of the metric at r's clean z (one forward and backward pass), the second
r's z recomputed exactly with only its via input moved (headlens.circuits.paths's patched z: the layer's
input norm, the projection, rotary, the softmax, the grouped key/value heads). Only what follows z_r is
linear. A direct edge is exact: the metric read from the final residual plus delta_s (final norm and
unembedding recomputed), as path patching does. Cost: per receiver layer and input, the senders of the
earlier layers stacked as copies of the batch through that one attention layer (no later layers: path
patching runs every later layer per receiver).
"""

from __future__ import annotations

import torch

from headlens.arch import adapter_for, get_module
from headlens.circuits.edges import VIAS
from headlens.circuits.paths import COPY_TOKENS, _patched_z, clean_run, sender_deltas
from headlens.heads import all_heads
from headlens.intervene.replace import frozen_weights
from headlens.intervene.sums import unit_sums


def z_gradients(adapter, evalset, rows: slice, ctx) -> list[torch.Tensor]:
    """dM/dz of every head at the clean run, per layer [batch, pos, head, d_head] (M the sum of the
    metric over the batch's scored positions)."""
    probes: list[torch.Tensor] = []

    def add(z):  # [batch, pos, head, d_head]
        probes.append(torch.zeros_like(z, requires_grad=True))
        return z + probes[-1]

    with torch.enable_grad(), frozen_weights(adapter.model):
        resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
        for layer in range(adapter.n_layers):
            block = adapter.layer(layer)
            with adapter.hooks() as hooks:
                hooks.z(layer, add)
                normed = get_module(block, adapter.sites.input_norm)(resid)  # [batch, pos, d_model]
                out = get_module(block, adapter.sites.attn)(normed, **ctx.attn_kwargs(1, layer))[0]
            resid = adapter.finish_block(layer, resid, out)
        value = unit_sums(adapter, resid, evalset, rows).sum()
        return list(torch.autograd.grad(value, probes))


def _direct(adapter, evalset, rows, state, deltas: torch.Tensor, chunk: int) -> torch.Tensor:
    """Each sender's exact direct effect summed over the batch's scored positions: [senders]."""
    base = unit_sums(adapter, state["final"], evalset, rows).double().sum()
    out = []
    for part in deltas.split(chunk):  # [copies, batch, pos, d_model]
        final = (state["final"][None] + part).flatten(0, 1)  # [copies * batch, pos, d_model]
        out.append(unit_sums(adapter, final, evalset, rows, copies=len(part)).double().sum(1) - base)
    return torch.cat(out)


def exact_receiver_tensors(model, evalset, reps) -> dict[str, torch.Tensor]:
    """EAP* of every edge, mean over scored positions, in attribution_tensors' layout: `edges`
    [n_layers, n_heads, n_layers, n_heads, 3] and `direct` [n_layers, n_heads] (float64)."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    edges = torch.zeros(n_layers, n_heads, n_layers, n_heads, 3, dtype=torch.float64)
    direct = torch.zeros(n_layers * n_heads, dtype=torch.float64)
    senders = all_heads(n_layers, n_heads)
    for rows in evalset.row_batches(None):
        ctx = adapter.context(*evalset.batch(rows))
        grads = z_gradients(adapter, evalset, rows, ctx)
        with torch.no_grad():
            state = clean_run(adapter, ctx)
            deltas = torch.cat(
                [
                    sender_deltas(adapter, state, reps[layer], senders[layer * n_heads : (layer + 1) * n_heads], rows)
                    for layer in range(n_layers)
                ]
            )  # [layer * head, batch, pos, d_model]
            chunk = max(1, COPY_TOKENS // int(state["final"].shape[0] * state["final"].shape[1]))
            direct += _direct(adapter, evalset, rows, state, deltas, chunk).cpu()
            for layer in range(1, n_layers):
                for index, via in enumerate(VIAS):
                    got = _receiver_layer(adapter, layer, state, ctx, deltas[: layer * n_heads], via, grads, chunk)
                    edges[:layer, :, layer, :, index] += got.view(layer, n_heads, n_heads)
    return {"edges": edges / evalset.n_tokens, "direct": direct.view(n_layers, n_heads) / evalset.n_tokens}


def _receiver_layer(adapter, layer: int, state, ctx, deltas, via: str, grads, chunk: int) -> torch.Tensor:
    """dM/dz_r . (z_r' - z_r) for every sender of `deltas` [senders, batch, pos, d_model] and receiver
    head r of `layer` through `via`: [senders, head] (float64)."""
    z, grad = state["z"][layer], grads[layer].double()  # [batch, pos, head, d_head] each
    out = []
    for part in deltas.split(chunk):
        moved = _patched_z(adapter, layer, state, ctx, part, via)  # [copies * batch, pos, head, d_head]
        change = moved.view(len(part), *z.shape) - z[None]  # [copies, batch, pos, head, d_head]
        out.append(torch.einsum("cbphd,bphd->ch", change.double(), grad).cpu())  # [copies, head]
    return torch.cat(out)
