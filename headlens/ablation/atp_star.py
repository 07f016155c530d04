"""AtP* at the z site (Kramar et al. 2024, "AtP*: An efficient and scalable method for localizing
LLM behaviour to components", arXiv 2403.00745).

Attribution patching estimates a head's ablation effect as grad_z . (z' - z), linearising every
path from the head to the metric. Kramar et al. find its worst failures where a change moves an
attention pattern through a saturated softmax, and fix it (the *QK fix*) by recomputing the
softmax exactly and linearising only from the pattern on:
  c_QK = sum_{t,s} (A'[t, s] - A[t, s]) dL/dA[t, s].
Ablating head h's z changes nothing inside h (z is after h's own softmax); it changes the queries
and keys of every *later* head g, which read h's output from the residual stream. So here the QK
fix applies to the later heads: for each head h of layer L,
 1. the residual entering layer L + 1 is recomputed exactly with h's z replaced (h's share of the
    output projection changes, then layer L's MLP runs on it);
 2. that change is added to the residual entering every later layer l (the direct path: the
    intermediate layers' own responses stay linearised), l's queries and keys are recomputed
    from it through the layer's own norm and projections (the adapter's `hook_qkv`), and each
    later head's pattern A' is rebuilt exactly (headlens.mha.pattern_rows);
 3. with dL/dA[t, s] = dL/dz_g[t] . v_g[s] (z_g = A v_g), the linearised pattern change
    A (ds - A.ds) that attribution patching used is swapped for the exact A' - A (the paper's QK
    fix), and the value change v' - v, which attribution patching weighs with the clean pattern
    A, is weighed with A' instead: the cross term (A' - A)(v' - v) that linearisation drops. It
    matters when a previous-token head is ablated: the induction head's keys *and* values move,
    and the values it no longer attends to no longer count. Together, z_g' - z_g = A'v' - Av is
    exact for the changed residual, and only what follows z_g is linearised.
GradDrop (the paper's second fix, per-layer gradient dropping to expose cancelling paths) gives
an unsigned score for ranking candidates; signed deltas are what this module estimates, so it is
not part of `atp_star_deltas`.
"""

from __future__ import annotations

import torch

from headlens.ablation.attribution import z_edit_hooks
from headlens.ablation.replace import Replacement, layer_replacement
from headlens.ablation.runner import LayerRunner
from headlens.arch import adapter_for
from headlens.mha import pattern_rows

BATCH_SIZE = 4  # sequences per forward + backward pass


def atp_star_deltas(model, evalset, reps: list[Replacement], batch_size: int = BATCH_SIZE) -> torch.Tensor:
    """AtP* estimate of every single-head ablation delta of the metric's mean: [n_layers, n_heads]."""
    adapter = adapter_for(model)
    total = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    n_seq = evalset.input_ids.shape[0]
    for start in range(0, n_seq, batch_size):
        rows = slice(start, min(start + batch_size, n_seq))
        clean = _clean_pass(model, evalset, rows, reps)
        total += clean["atp"]
        total += _qk_correction(model, evalset, rows, clean)
    return (total / evalset.n_tokens).float()


def _clean_pass(model, evalset, rows: slice, reps) -> dict:
    """One forward + backward of a batch, layer by layer: per layer the residual entering it, its
    attention output, z, dL/dz, the change z' - z of every head, and q, k, v; `atp`
    [layer, head] = sum(dL/dz . (z' - z)) (plain attribution patching)."""
    adapter = adapter_for(model)
    runner = LayerRunner(model, evalset.input_ids[rows], evalset.mask[rows])
    state = {"resid": [], "out": [], "z": [], "eps": [], "qkv": []}

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        eps = torch.zeros_like(z, requires_grad=True)  # [batch, pos, head, d_head] probe of dL/dz
        state["z"].append(z.detach())
        state["eps"].append(eps)
        return z + eps

    with torch.enable_grad(), z_edit_hooks(model, edit):
        resid = runner.embed()  # [batch, pos, d_model]
        for layer in range(adapter.n_layers):
            handles = adapter.hook_qkv(layer, lambda q, k, v: state["qkv"].append((q.detach(), k.detach(), v.detach())))
            try:
                _, out = runner.attention(layer, resid)  # [batch, pos, d_model]
            finally:
                for handle in handles:
                    handle.remove()
            state["resid"].append(resid.detach())
            state["out"].append(out.detach())
            resid = runner.finish_block(layer, resid, out)
        value = runner.unit_sums(resid, evalset, rows).sum()
        grads = torch.autograd.grad(value, state["eps"])  # each [batch, pos, head, d_head]
    state["grad"] = [g.detach() for g in grads]
    state["delta"] = [_z_change(z, layer_replacement(reps[layer], rows)) for layer, z in enumerate(state["z"])]
    state["atp"] = torch.stack([(g * d).sum((0, 1, 3)) for g, d in zip(state["grad"], state["delta"],
                                                                     strict=True)]).double().cpu()
    state["runner"] = runner
    return state


def _z_change(z: torch.Tensor, rep: Replacement) -> torch.Tensor:
    """z' - z for every head of a layer: [batch, pos, head, d_head]."""
    return -z if rep is None else rep.to(z.dtype).expand_as(z) - z


def _qk_correction(model, evalset, rows: slice, clean: dict) -> torch.Tensor:
    """Exact-softmax minus linearised pattern contribution of every head's ablation to the
    later heads' z: [layer, head] (sums over the batch)."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    runner = clean["runner"]
    mask = evalset.mask[rows].to(clean["z"][0].device)  # [batch, pos]
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    with torch.no_grad():
        for layer in range(n_layers - 1):
            w_o = adapter.w_o(layer)  # [head, d_head, d_model]
            after = runner.finish_block(layer, clean["resid"][layer], clean["out"][layer])  # [batch, pos, d_model]
            for head in range(n_heads):
                edited = clean["out"][layer] + clean["delta"][layer][:, :, head] @ w_o[head]  # [batch, pos, d_model]
                change = runner.finish_block(layer, clean["resid"][layer], edited) - after  # [batch, pos, d_model]
                out[layer, head] = sum(_later_layer_fix(adapter, runner, clean, later, change, mask)
                                       for later in range(layer + 1, n_layers))
    return out


def _later_layer_fix(adapter, runner, clean: dict, layer: int, change: torch.Tensor, mask: torch.Tensor) -> float:
    """sum_g sum_t dL/dz_g[t] . ((A' - A - A (ds - A . ds)) v + (A' - A)(v' - v))[t] over the heads
    g of `layer`, with the residual entering it moved by `change`."""
    q, k, v = clean["qkv"][layer]  # q [batch, head, pos, d_head], k, v [batch, kv_head, pos, d_head]
    seen = []
    handles = adapter.hook_qkv(layer, lambda q2, k2, v2: seen.append((q2, k2, v2)))
    try:
        runner.attention(layer, clean["resid"][layer] + change)
    finally:
        for handle in handles:
            handle.remove()
    q2, k2, v2 = seen[0]
    scale, window, pos = adapter.attention_scale(layer), adapter.sliding_window(layer), q.shape[2]
    a = pattern_rows(q, k, mask, scale, 0, pos, window)  # [batch, head, q_pos, k_pos]
    a2 = pattern_rows(q2, k2, mask, scale, 0, pos, window)  # [batch, head, q_pos, k_pos]
    groups = q.shape[1] // k.shape[1]
    k, k2, v, v2 = (t.repeat_interleave(groups, dim=1) for t in (k, k2, v, v2))  # [batch, head, pos, d_head]
    ds = (q2 @ k2.transpose(-2, -1) - q @ k.transpose(-2, -1)) * scale  # [batch, head, q_pos, k_pos]
    linear = a * (ds - (a * ds).sum(-1, keepdim=True))  # [batch, head, q_pos, k_pos] softmax Jacobian . ds
    dz = ((a2 - a) - linear) @ v + (a2 - a) @ (v2 - v)  # [batch, head, q_pos, d_head]
    grad = clean["grad"][layer].transpose(1, 2)  # [batch, head, pos, d_head]
    return float((grad * dz).double().sum())
