"""Edge attribution: every edge's path-patching effect estimated from gradients, and its agreement
with exact path patching.

EAP (edge attribution patching, Syed et al. 2023, arXiv 2310.10348): an edge's effect is
linearised at the clean run, attribution(s -> r.via) = sum over scored batches and positions of
delta_s . dM/dx_{r,via}, where delta_s is the change of the sender's write when its z is replaced
(headlens.circuits.paths.sender_deltas: zero, mean or resampled, as `ablate` replaces) and
x_{r,via} the residual stream as receiver r's query, key or value projection reads it (before
the layer's input norm); for a direct edge, dM/d(final residual). One forward and one backward
pass give every edge:
- each q, k, v projection's output gets a zero probe whose gradient is dM/d(row), per head;
- a query head's own key and value gradients, where grouped-query attention shares one key/value
  head among g query heads: the layer's attention runs on g stacked copies of its input and query
  head h keeps the z of copy h mod g, so copy j's key/value probe sees only its heads;
- dM/dx_{r,via} = J_norm(x)^T (dM/d(row_r) W_row_r): the row's slice of the projection, then the
  input norm's vector-Jacobian product at the clean residual.
EAP-IG (Hanna et al. 2024, "Have Faith in Faithfulness", arXiv 2403.17806): the gradient is
averaged over `steps` points between the ablated and the clean run, as integrated gradients
does (Sundararajan et al. 2017), at Gauss-Legendre nodes with their weights (`ig_points`; Captum's
default rule: exact for integrands polynomial up to degree 2 * steps - 1, where left or right Riemann
sums are exact only for constants). With counterfactual patching (headlens.circuits.paths.PATCH: the
senders' z from the task's corrupted run) the path is Hanna et al.'s: the input embeddings move from
the clean run's towards the corrupted run's, everything after them recomputed. With zero, mean or
resampled z there is no corrupted input, so every head's z moves towards its replacement at once,
z + a (z' - z) (integrated gradients over activations). Either way the gradient is taken in a partly
corrupted model, while path patching changes one edge alone in the clean one. Cost: `steps` forward
and backward passes. EAP* (headlens.circuits.receivers) recomputes each receiver's attention exactly.
`edge_agreement` compares an estimate with exact path patching on the edges both have: Spearman
and Pearson correlation and top-k recall (the share of the exact top k edges by |effect| that
are also in the estimate's top k by |attribution|).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from headlens.arch import adapter_for, get_module
from headlens.arch.sites import row_part
from headlens.circuits.edges import DIRECT, LOGITS, VIAS, edge_frame
from headlens.circuits.paths import PATCH, clean_run, corrupted_ids, sender_deltas, task_replacements
from headlens.circuits.receivers import exact_receiver_tensors
from headlens.errors import ConfigError
from headlens.heads import all_heads
from headlens.intervene.metrics import DIFFERENTIABLE
from headlens.intervene.replace import frozen_weights, layer_replacement, z_change
from headlens.intervene.sums import unit_sums
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

EAP_METHODS = ("eap", "eap-ig", "eap*")  # eap*: headlens.circuits.receivers
IG_STEPS = 5  # EAP-IG's interpolation points (Hanna et al. 2024 use 5)
TOP_K = 20  # edges compared by top-k recall


def _probed_attention(adapter, layer: int, resid, ctx, edit, probes: dict) -> torch.Tensor:
    """`layer`'s attention output [batch, pos, d_model] with a zero probe (requires grad) added to
    each q/k/v projection's output (`probes[path]`, [copies * batch, pos, out]) and z edited by
    edit(z); with grouped-query attention run on n_heads / n_kv_heads stacked copies of the
    input, query head h keeping copy h mod copies' z (module docstring)."""
    block, batch = adapter.layer(layer), resid.shape[0]
    copies = adapter.n_heads // adapter.n_kv_heads
    heads = torch.arange(adapter.n_heads)

    def probe(path):
        def add(out):
            probes[path] = torch.zeros_like(out, requires_grad=True)  # [copies * batch, pos, out]
            return out + probes[path]

        return add

    def combine(z):  # [copies * batch, pos, head, d_head]
        z = z.view(copies, batch, *z.shape[1:])[heads % copies, :, :, heads]  # [head, batch, pos, d_head]
        z = edit(z.permute(1, 2, 0, 3))  # [batch, pos, head, d_head]
        return z.repeat(copies, 1, 1, 1)

    normed = get_module(block, adapter.sites.input_norm)(resid)  # [batch, pos, d_model]
    with adapter.hooks() as hooks:
        for path in dict.fromkeys(getattr(adapter.sites, via).projection for via in VIAS):
            hooks.output(get_module(block, path), probe(path))
        hooks.z(layer, combine)
        out = get_module(block, adapter.sites.attn)(normed.repeat(copies, 1, 1), **ctx.attn_kwargs(copies, layer))[0]
    return out[:batch]  # [batch, pos, d_model]: every copy carries the combined z


def _input_grads(adapter, layer: int, x: torch.Tensor, probe_grads: dict) -> torch.Tensor:
    """dM/dx_{r,via} of every query head r of `layer` and via q, k, v: [head, 3, batch, pos,
    d_model], from the probes' gradients and the residual x [batch, pos, d_model] entering the layer."""
    block, n_heads, d_head = adapter.layer(layer), adapter.n_heads, adapter.d_head
    copies, batch = n_heads // adapter.n_kv_heads, x.shape[0]
    heads = torch.arange(n_heads)
    per_via = []
    for index, via in enumerate(VIAS):
        site = getattr(adapter.sites, via)
        n_row = getattr(adapter, site.split.heads)
        grad = row_part(probe_grads[site.projection], site, n_row, d_head)  # [copies * batch, pos, n_row * d_head]
        grad = grad.reshape(copies, batch, grad.shape[1], n_row, d_head)  # [copies, batch, pos, row, d_head]
        weight = adapter.qkv_weights(layer)[index][0].detach().view(n_row, d_head, -1)  # [row, d_head, d_model]
        rows = heads if via == "q" else torch.tensor([adapter.kv_group(h) for h in range(n_heads)])
        mine = grad[heads % copies, :, :, rows]  # [head, batch, pos, d_head]
        per_via.append(torch.einsum("hbpd,hdm->hbpm", mine, weight[rows]))  # [head, batch, pos, d_model]
    normed_grad = torch.stack(per_via, 1).flatten(0, 1)  # [head * 3, batch, pos, d_model]
    xx = x.detach()[None].expand(normed_grad.shape[0], *x.shape).clone().requires_grad_(True)
    norm = get_module(block, adapter.sites.input_norm)
    (grad_x,) = torch.autograd.grad(norm(xx), xx, normed_grad)  # [head * 3, batch, pos, d_model]
    return grad_x.view(n_heads, 3, *x.shape)


def ig_points(steps: int) -> list[tuple[float, float]]:
    """EAP-IG's interpolation points and weights on [0, 1]: Gauss-Legendre nodes (Captum's default rule
    for integrated gradients), exact for integrands polynomial up to degree 2 * steps - 1."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return [(float((x + 1) / 2), float(w / 2)) for x, w in zip(nodes, weights, strict=True)]


def _start(adapter, ctx, corrupt, alpha: float) -> torch.Tensor:
    """The residual entering layer 0 [batch, pos, d_model]: the clean embeddings, moved a fraction
    `alpha` towards the corrupted run's (token ids `corrupt`, [batch, pos]) when there is one."""
    resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
    if corrupt is None or alpha == 0.0:
        return resid
    other = adapter.embed_tokens(dataclasses.replace(ctx, input_ids=corrupt.to(ctx.input_ids.device)))
    return resid + alpha * (other - resid)  # [batch, pos, d_model]


def _batch_attribution(adapter, evalset, rows, reps, point, deltas: torch.Tensor, out: dict, corrupt=None) -> None:
    """Add weight * delta_s . dM/dx of one batch at interpolation point `point` = (alpha, weight) to
    out["edges"] [layer, head, layer, head, 3] and out["direct"] [layer, head]; deltas [layer, head,
    batch, pos, d_model]. With `corrupt` (the corrupted run's ids of the batch) the input embeddings
    move a fraction alpha towards the corrupted run's, else every head's z towards its replacement."""
    alpha, weight = point
    ctx = adapter.context(*evalset.batch(rows))
    n_layers = adapter.n_layers
    probes: list[dict] = [{} for _ in range(n_layers)]
    xs = []

    def editor(layer):
        def edit(z):  # [batch, pos, head, d_head]
            if alpha == 0.0 or corrupt is not None:
                return z
            return z + alpha * z_change(z, layer_replacement(reps[layer], rows, z.shape[1]))

        return edit

    with torch.enable_grad(), frozen_weights(adapter.model):
        resid = _start(adapter, ctx, corrupt, alpha)  # [batch, pos, d_model]
        for layer in range(n_layers):
            xs.append(resid.detach())
            attn = _probed_attention(adapter, layer, resid, ctx, editor(layer), probes[layer])
            resid = adapter.finish_block(layer, resid, attn)
        final_probe = torch.zeros_like(resid, requires_grad=True)  # [batch, pos, d_model]
        value = unit_sums(adapter, resid + final_probe, evalset, rows).sum()
        flat = [final_probe] + [p for layer_probes in probes for p in layer_probes.values()]
        grads = iter(torch.autograd.grad(value, flat))
        final_grad = next(grads)  # [batch, pos, d_model]
        probe_grads = [{path: next(grads) for path in layer_probes} for layer_probes in probes]
        n_heads = adapter.n_heads
        flat_deltas = weight * deltas.flatten(2).double()  # [layer, head, batch * pos * d_model]
        out["direct"] += (flat_deltas @ final_grad.flatten().double()).cpu()  # [layer, head]
        for layer in range(1, n_layers):
            grad_x = _input_grads(adapter, layer, xs[layer], probe_grads[layer])  # [head, 3, batch, pos, d_model]
            senders = flat_deltas[:layer].flatten(0, 1)  # [layer * head, batch * pos * d_model]
            got = senders @ grad_x.flatten(2).double().flatten(0, 1).T  # [layer * head, head * 3]
            out["edges"][:layer, :, layer] += got.view(layer, n_heads, n_heads, 3).cpu()


def attribution_tensors(
    model, evalset, reps, method: str = "eap", steps: int = IG_STEPS, corrupted: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Every edge's attribution, mean over scored positions: `edges` [n_layers, n_heads, n_layers,
    n_heads, 3] (sender, receiver, q/k/v; 0 unless the sender is earlier) and `direct` [n_layers,
    n_heads] (float64). `corrupted` [n_seq, pos]: the corrupted run's ids in the evaluation set's layout,
    whose embeddings EAP-IG interpolates (reps then its z, headlens.circuits.paths.PATCH)."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    points = [(0.0, 1.0)] if method == "eap" else ig_points(steps)
    out = {
        "edges": torch.zeros(n_layers, n_heads, n_layers, n_heads, 3, dtype=torch.float64),
        "direct": torch.zeros(n_layers, n_heads, dtype=torch.float64),
    }
    senders = all_heads(n_layers, n_heads)
    for rows in evalset.row_batches(None):
        with torch.no_grad():
            state = clean_run(adapter, adapter.context(*evalset.batch(rows)))
            deltas = torch.stack(
                [
                    sender_deltas(adapter, state, reps[layer], senders[layer * n_heads : (layer + 1) * n_heads], rows)
                    for layer in range(n_layers)
                ]
            )  # [layer, head, batch, pos, d_model]
        corrupt = None if corrupted is None else corrupted[rows, : deltas.shape[3]]  # [batch, pos]
        for point in points:
            _batch_attribution(adapter, evalset, rows, reps, point, deltas, out, corrupt)
    return {name: value / evalset.n_tokens for name, value in out.items()}


def edge_attribution(
    loaded: LoadedModel, task, method: str = "eap", steps: int = IG_STEPS, ablation: str = "zero", seed: int = 0
) -> Result:
    """EAP or EAP-IG (`steps` points) of every edge, with the senders' z replaced by `ablation`
    (zero, mean, resample, or PATCH: the corrupted run's z, EAP-IG then interpolating the input
    embeddings): a Result of kind "edges" (headlens.results) whose frame is an edge frame with
    `attribution` (the metric's units), receiver-major with the direct edges last, and the method in
    `attribution_method`; its meta: `model`, `measure` ("attribution"), `method`, `steps`, `ablation`,
    `metric`, `seed`."""
    if method not in EAP_METHODS:
        raise ConfigError(f"unknown edge attribution {method!r}: choose one of {', '.join(EAP_METHODS)}")
    if steps < 1:
        raise ConfigError(f"EAP-IG steps must be >= 1, got {steps}")
    evalset, reps = task_replacements(loaded, task, ablation, seed)
    if evalset.metric not in DIFFERENTIABLE:
        raise ConfigError(f"metric {evalset.metric} has no gradient: edge attribution needs one of {DIFFERENTIABLE}")
    if method == "eap*":
        got = exact_receiver_tensors(loaded.model, evalset, reps)
    else:
        corrupted = corrupted_ids(evalset) if ablation == PATCH else None
        got = attribution_tensors(loaded.model, evalset, reps, method, steps, corrupted)
    n_layers, n_heads = got["direct"].shape
    heads = all_heads(n_layers, n_heads)
    send, recv, vias, values = [], [], [], []
    for r in heads:
        for s in heads[: r.layer * n_heads]:
            for index, via in enumerate(VIAS):
                send.append(s)
                recv.append(str(r))
                vias.append(via)
                values.append(float(got["edges"][s.layer, s.head, r.layer, r.head, index]))
    for s in heads:
        send.append(s)
        recv.append(LOGITS)
        vias.append(DIRECT)
        values.append(float(got["direct"][s.layer, s.head]))
    label = f"{method} ({steps} steps)" if method == "eap-ig" else method
    frame = edge_frame(send, recv, vias, attribution=np.array(values), attribution_method=label)
    meta = {"model": str(loaded.name), "measure": "attribution", "method": method, "steps": steps}
    return Result("edges", frame, {**meta, "ablation": ablation, "metric": evalset.metric, "seed": seed})


def edge_agreement(exact: pd.DataFrame, approx: pd.DataFrame, k: int = TOP_K) -> dict:
    """How well `approx`'s attribution ranks `exact`'s effect on the edges both measured:
    `spearman`, `pearson`, `top_k_recall` (k = min(k, n_edges // 4), so that few edges do not
    make it 1 by default), `top_k`, `top_flipped` (of the exact top k, estimates with the wrong
    sign) and `n_edges`."""
    key = ["sender", "receiver", "via"]
    merged = exact[[*key, "effect"]].merge(approx[[*key, "attribution"]], on=key).dropna()
    x, y = merged["effect"], merged["attribution"]
    k = min(k, max(1, len(merged) // 4))
    top_x, top_y = set(x.abs().nlargest(k).index), set(y.abs().nlargest(k).index)
    top = merged.loc[sorted(top_x)]
    return {
        "spearman": float(x.rank().corr(y.rank())),
        "pearson": float(x.corr(y)),
        "top_k_recall": len(top_x & top_y) / k if k else float("nan"),
        "top_k": k,
        "top_flipped": int(((top["effect"] * top["attribution"]) < 0).sum()),
        "n_edges": len(merged),
    }
