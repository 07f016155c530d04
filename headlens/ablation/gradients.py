"""Every single-head ablation estimated from gradients, and Michel et al.'s head importance.

Each puts a differentiable edit on every head's z (the input of the output projection, through the
architecture adapter's `hook_z`; transformers 5 has no `head_mask`, so the gate is our own hook,
headlens.intervene.replace.z_edit_hooks) and takes forward and backward passes, a batch of
sequences at a time. Weights never require grad here, so backward computes activation gradients only.
- `attribution_deltas`: attribution patching (Nanda 2023; Syed et al. 2023, arXiv 2310.10348);
- `atp_star_deltas`: AtP* (Kramar et al. 2024, arXiv 2403.00745) at the z site, the QK fix;
- `graddrop_scores`: AtP*'s second fix, GradDrop, an unsigned score for ranking;
- `head_importance`: Michel et al. 2019 (arXiv 1905.10650), the pruning order.

AtP* (Kramar et al.): attribution patching estimates a head's ablation effect as grad_z . (z' - z),
linearising every path from the head to the metric. Its worst failures are where a change moves an
attention pattern through a saturated softmax; the *QK fix* recomputes the softmax exactly and
linearises only from the pattern on: c_QK = sum_{t,s} (A'[t, s] - A[t, s]) dL/dA[t, s].
Ablating head h's z changes nothing inside h (z is after h's own softmax); it changes the queries
and keys of every *later* head g, which read h's output from the residual stream. So here the QK
fix applies to the later heads: for each head h of layer L,
 1. the residual entering layer L + 1 is recomputed exactly with h's z replaced (h's share of the
    output projection changes, then layer L's MLP runs on it);
 2. that change is added to the residual entering every later layer l (the direct path: the
    intermediate layers' own responses stay linearised), l's queries and keys are recomputed
    from it through the layer's own norm and projections (the adapter's `hook_qkv`), and each
    later head's pattern A' is rebuilt exactly (headlens.arch.mha.pattern_rows);
 3. with dL/dA[t, s] = dL/dz_g[t] . v_g[s] (z_g = A v_g), the linearised pattern change
    A (ds - A.ds) that attribution patching used is swapped for the exact A' - A (the paper's QK
    fix), and the value change v' - v, which attribution patching weighs with the clean pattern
    A, is weighed with A' instead: the cross term (A' - A)(v' - v) that linearisation drops. It
    matters when a previous-token head is ablated: the induction head's keys *and* values move,
    and the values it no longer attends to no longer count. Together, z_g' - z_g = A'v' - Av is
    exact for the changed residual, and only what follows z_g is linearised.
Steps 1-3 are batched across the ablated heads (as the paper batches its QK fix over key positions):
the heads of layer L are stacked along the batch dimension, so each later layer runs once per
layer L (per chunk of heads that fits QK_FIX_ELEMENTS), not once per ablated head; each stacked
copy is computed as the single head's would be.

GradDrop (Kramar et al.): paths of opposite sign can cancel in the gradient and hide a head that
matters. GradDrop reruns attribution patching once per layer l with the gradient through layer l's
write to the residual stream dropped (the write keeps its value; only its gradient is zeroed, so
paths through l vanish from the estimate) and scores each head by the mean absolute estimate over
the layers after it: graddrop(h) = mean_{l > layer(h)} |AtP_{drop l}(h)| (last-layer heads:
|AtP(h)|). It ranks heads for verification (the paper's use); it is not a signed delta. Cost: one
forward and backward pass per layer after the first.
"""

from __future__ import annotations

import torch

from headlens import distributed
from headlens.arch import adapter_for
from headlens.arch.mha import pattern_rows
from headlens.intervene.evalset import BATCH_SIZE
from headlens.intervene.replace import Replacement, layer_replacement, z_change, z_edit_hooks
from headlens.intervene.sums import scored_values, unit_sums

# Elements of one stacked pattern [heads * batch, head, q_pos, k_pos] in the batched QK fix: bounds
# how many ablated heads run through a later layer together (2^24 float32 = 64 MB per such tensor).
QK_FIX_ELEMENTS = 2**24


def scored_with_grad(model, evalset, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's value at every scored position of one batch, with grad: [n_scored], and
    the sequence (within the batch) of each: [n_scored].

    The trunk runs whole (it applies the final norm); only scored positions go through the
    unembedding, a vocabulary chunk at a time (headlens.intervene.metrics: one logits copy for
    backward instead of autograd's logits, log_softmax and their gradients)."""
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in evalset.batch(rows))  # [batch, width]
    hidden = adapter.run_trunk(ids, mask)  # [batch, pos, d_model]
    seq, pos = torch.nonzero(evalset.counted[rows].to(device), as_tuple=True)  # scored (sequence, position) pairs
    return scored_values(hidden[seq, pos], adapter.unembed(), evalset, rows, seq, pos), seq


def attribution_deltas(model, evalset, reps: list[Replacement], batch_size: int | None = BATCH_SIZE) -> torch.Tensor:
    """Linear estimate of every single-head ablation delta of the metric's mean: [n_layers, n_heads].

    Attribution patching (Nanda 2023; Syed et al. 2023, arXiv 2310.10348): with
    z_h' = z_h + a_h (r_h - z_h), dLoss/da_h at a = 0 is sum(grad_z_h * (r_h - z_h)), the
    first-order change when z_h is replaced by r_h; for zero ablation -sum(grad_z_h * z_h).
    It misses saturated attention and nonlinear effects: check it against the exact sweep.
    """
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    for rows in evalset.row_batches(batch_size):
        alphas = [torch.zeros(n_heads, requires_grad=True) for _ in range(n_layers)]  # [head] per layer

        def edit(layer: int, z: torch.Tensor, rows=rows, alphas=alphas) -> torch.Tensor:
            change = z_change(z, layer_replacement(reps[layer], rows, z.shape[1]))  # [batch, pos, head, d_head]
            return z + alphas[layer].to(z.device)[None, None, :, None] * change  # [batch, pos, head, d_head]

        with torch.enable_grad(), z_edit_hooks(model, edit):
            total_value = scored_with_grad(model, evalset, rows)[0].sum()
            grads = torch.autograd.grad(total_value, alphas)
        total += torch.stack(grads).double().cpu()
    return (total / evalset.n_tokens).float()


def head_importance(
    model, evalset, keep: torch.Tensor, batch_size: int | None = BATCH_SIZE, shard_batches: bool = False
) -> torch.Tensor:
    """Michel et al. 2019 (arXiv 1905.10650) head importance I_h = E_x |dL(x)/d xi_h|: [n_layers, n_heads].

    xi is a gate on each head's z (1 = kept, 0 = pruned: `keep` [n_layers, n_heads]); one gate
    per sequence, so a single backward pass gives each sequence's own gradient before the
    absolute value; L(x) is the sequence's mean counted loss. Not yet normalised per layer.
    `shard_batches` (a collective): batches split over the ranks and their sums added in batch
    order, equal to one process's result exactly.
    """
    n_layers, n_heads = keep.shape
    n_seq = evalset.input_ids.shape[0]
    counts = evalset.counted.sum(1).clamp(min=1)  # [n_seq]
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    indexed = enumerate(evalset.row_batches(batch_size))
    parts = {}  # batch index -> (0, its summed |gradients| [layer, head]) when sharded
    for index, rows in distributed.shard(indexed) if shard_batches else indexed:
        n_rows = rows.stop - rows.start
        gates = [
            keep[layer].float().repeat(n_rows, 1).requires_grad_(True)  # [batch, head]
            for layer in range(n_layers)
        ]

        def edit(layer: int, z: torch.Tensor, gates=gates) -> torch.Tensor:
            return z * gates[layer].to(z.device)[:, None, :, None]  # [batch, pos, head, d_head]

        with torch.enable_grad(), z_edit_hooks(model, edit):
            values, seq = scored_with_grad(model, evalset, rows)  # [n_scored], [n_scored]
            sums = torch.zeros(rows.stop - rows.start, dtype=values.dtype, device=values.device)  # [batch]
            per_seq = sums.index_add(0, seq, values) / counts[rows].to(sums.device, sums.dtype)  # [batch]
            grads = torch.autograd.grad(per_seq.sum(), gates)  # each [batch, head]
        batch_sums = torch.stack([g.abs().sum(0) for g in grads]).double().cpu()  # [layer, head]
        if shard_batches:
            parts[index] = (0, batch_sums)
        else:
            total += batch_sums  # batches in order: the sum sum_in_order reproduces
    if shard_batches:
        total = distributed.sum_in_order(parts, total)
    return (total / n_seq).float()


def normalize_by_layer(importance: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Michel et al.: divide each layer's importances by their L2 norm (over the kept heads)."""
    kept = importance * keep  # [layer, head]
    norm = kept.norm(dim=1, keepdim=True)  # [layer, 1]
    return torch.where(norm > 0, kept / norm.clamp(min=1e-30), kept)


def atp_star_deltas(model, evalset, reps: list[Replacement], batch_size: int | None = BATCH_SIZE) -> torch.Tensor:
    """AtP* estimate of every single-head ablation delta of the metric's mean: [n_layers, n_heads]."""
    adapter = adapter_for(model)
    total = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    for rows in evalset.row_batches(batch_size):
        clean = _clean_pass(model, evalset, rows, reps)
        total += clean["atp"]
        total += _qk_correction(model, evalset, rows, clean)
    return (total / evalset.n_tokens).float()


def _clean_pass(model, evalset, rows: slice, reps) -> dict:
    """One forward + backward of a batch, layer by layer: per layer the residual entering it, its
    attention output, z, dL/dz, the change z' - z of every head, and q, k, v; `atp`
    [layer, head] = sum(dL/dz . (z' - z)) (plain attribution patching)."""
    adapter = adapter_for(model)
    ids, mask = evalset.batch(rows)  # [batch, width]
    ctx = adapter.context(ids, mask)
    state = {"resid": [], "out": [], "z": [], "eps": [], "qkv": []}

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        eps = torch.zeros_like(z, requires_grad=True)  # [batch, pos, head, d_head] probe of dL/dz
        state["z"].append(z.detach())
        state["eps"].append(eps)
        return z + eps

    with torch.enable_grad(), z_edit_hooks(model, edit):
        resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
        for layer in range(adapter.n_layers):
            with adapter.hooks() as hooks:
                hooks.qkv(layer, lambda q, k, v: state["qkv"].append((q.detach(), k.detach(), v.detach())))
                _, out = adapter.attention(layer, resid, ctx)  # [batch, pos, d_model]
            state["resid"].append(resid.detach())
            state["out"].append(out.detach())
            resid = adapter.finish_block(layer, resid, out)
        value = unit_sums(adapter, resid, evalset, rows).sum()
        grads = torch.autograd.grad(value, state["eps"])  # each [batch, pos, head, d_head]
    state["grad"] = [g.detach() for g in grads]
    state["delta"] = [
        z_change(z, layer_replacement(reps[layer], rows, z.shape[1])) for layer, z in enumerate(state["z"])
    ]
    state["atp"] = (
        torch.stack([(g * d).sum((0, 1, 3)) for g, d in zip(state["grad"], state["delta"], strict=True)]).double().cpu()
    )
    state["ctx"] = ctx
    state["mask"] = mask.to(state["z"][0].device)  # [batch, width]
    return state


def _qk_correction(model, evalset, rows: slice, clean: dict, chunk: int | None = None) -> torch.Tensor:
    """Exact-softmax minus linearised pattern contribution of every head's ablation to the
    later heads' z: [layer, head] (sums over the batch). The heads of a layer are batched:
    `chunk` of them (default: as many as QK_FIX_ELEMENTS allows) are stacked along the batch
    dimension and run through each later layer together, once."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=clean["mask"].device)  # [layer, head]
    batch, pos = clean["mask"].shape
    per_layer = batch * n_heads * pos * pos  # elements of one layer's pattern
    keep = n_layers * per_layer <= 4 * QK_FIX_ELEMENTS  # every later layer's clean tensors fit: made once
    fixed: dict[int, dict] = {}
    with torch.no_grad():
        chunk = chunk or max(1, QK_FIX_ELEMENTS // per_layer)
        for layer in range(n_layers - 1):
            for start in range(0, n_heads, chunk):
                heads = list(range(start, min(n_heads, start + chunk)))
                change = _residual_changes(adapter, clean, layer, heads)  # [len(heads) * batch, pos, d_model]
                for later in range(layer + 1, n_layers):
                    found = fixed.get(later) or _clean_layer(adapter, clean, later)
                    if keep:
                        fixed[later] = found
                    out[layer, start : start + len(heads)] += _later_layer_fix(
                        adapter, clean, found, later, change, len(heads)
                    )
    return out.cpu()  # one copy to the host per batch


def _residual_changes(adapter, clean: dict, layer: int, heads: list[int]) -> torch.Tensor:
    """The exact change of the residual leaving `layer` when each of `heads` alone has its z
    replaced (its share of the output projection, then the layer's MLP): [heads * batch, pos, d_model],
    head-major (copies of the batch, as `Adapter.attention(..., copies)` takes them)."""
    copies = len(heads)
    w_o = adapter.w_o(layer)[heads]  # [copies, d_head, d_model]
    delta = clean["delta"][layer][:, :, heads]  # [batch, pos, copies, d_head]
    resid, out = clean["resid"][layer], clean["out"][layer]  # [batch, pos, d_model]
    edited = out[None] + torch.einsum("bpcd,cdm->cbpm", delta, w_o)  # [copies, batch, pos, d_model]
    after = adapter.finish_block(layer, resid, out)  # [batch, pos, d_model]
    moved = adapter.finish_block(
        layer, resid.repeat(copies, 1, 1), edited.flatten(0, 1)
    )  # [copies * batch, pos, d_model]
    return moved - after.repeat(copies, 1, 1)  # [copies * batch, pos, d_model]


def _clean_layer(adapter, clean: dict, layer: int) -> dict:
    """What the QK fix reads from `layer`'s clean run, the same for every ablated head: its
    pattern A, scores, keys and values expanded to every query head, and dL/dz."""
    q, k, v = clean["qkv"][layer]  # q [batch, head, pos, d_head], k, v [batch, kv_head, pos, d_head]
    scale, window, pos = adapter.attention_scale(layer), adapter.sliding_window(layer), q.shape[2]
    groups = q.shape[1] // k.shape[1]
    k_all, v_all = (t.repeat_interleave(groups, dim=1) for t in (k, v))  # [batch, head, pos, d_head]
    return {
        "a": pattern_rows(q, k, clean["mask"], scale, 0, pos, window),  # [batch, head, q_pos, k_pos]
        "scores": q @ k_all.transpose(-2, -1) * scale,  # [batch, head, q_pos, k_pos]
        "v": v_all,  # [batch, head, pos, d_head]
        "grad": clean["grad"][layer].transpose(1, 2),  # [batch, head, pos, d_head]
        "scale": scale,
        "window": window,
    }


def _later_layer_fix(adapter, clean: dict, fixed: dict, layer: int, change: torch.Tensor, copies: int) -> torch.Tensor:
    """sum_g sum_t dL/dz_g[t] . ((A' - A - A (ds - A . ds)) v + (A' - A)(v' - v))[t] over the heads
    g of `layer`, with the residual entering it moved by each of `copies` stacked changes
    ([copies * batch, pos, d_model]): [copies]."""
    seen = []
    with adapter.hooks() as hooks:
        hooks.qkv(layer, lambda q2, k2, v2: seen.append((q2, k2, v2)))
        adapter.attention(layer, clean["resid"][layer].repeat(copies, 1, 1) + change, clean["ctx"], copies)
    q2, k2, v2 = seen[0]  # q2 [copies * batch, head, pos, d_head], k2, v2 [copies * batch, kv_head, pos, d_head]
    pos, groups = q2.shape[2], q2.shape[1] // k2.shape[1]
    a2 = pattern_rows(q2, k2, clean["mask"].repeat(copies, 1), fixed["scale"], 0, pos, fixed["window"])
    k2, v2 = (t.repeat_interleave(groups, dim=1) for t in (k2, v2))  # [copies * batch, head, pos, d_head]
    split = (copies, -1, *a2.shape[1:])
    a, a2 = fixed["a"], a2.view(split)  # [batch, head, q_pos, k_pos], [copies, batch, head, q_pos, k_pos]
    ds = (q2 @ k2.transpose(-2, -1) * fixed["scale"]).view(split) - fixed[
        "scores"
    ]  # [copies, batch, head, q_pos, k_pos]
    linear = a * (ds - (a * ds).sum(-1, keepdim=True))  # [copies, batch, head, q_pos, k_pos] softmax Jacobian . ds
    dv = v2.view(copies, *fixed["v"].shape) - fixed["v"]  # [copies, batch, head, pos, d_head]
    dz = ((a2 - a) - linear) @ fixed["v"] + (a2 - a) @ dv  # [copies, batch, head, q_pos, d_head]
    return (fixed["grad"] * dz).double().sum((1, 2, 3, 4))  # [copies]


def graddrop_scores(model, evalset, reps: list[Replacement], batch_size: int | None = BATCH_SIZE) -> torch.Tensor:
    """GradDrop score of every head (see the module docstring): [n_layers, n_heads], >= 0."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    sums = torch.zeros(n_layers + 1, n_layers, n_heads, dtype=torch.float64)  # [drop (n_layers: none), layer, head]
    for rows in evalset.row_batches(batch_size):
        for drop in [*range(1, n_layers), n_layers]:
            sums[drop] += _attribution(model, evalset, rows, reps, drop)
    estimates = (sums / evalset.n_tokens).abs()  # [drop, layer, head]
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    for layer in range(n_layers):
        later = estimates[layer + 1 : n_layers, layer]  # [n_later, head]
        out[layer] = later.mean(0) if len(later) else estimates[n_layers, layer]
    return out.float()


def _attribution(model, evalset, rows: slice, reps, drop: int) -> torch.Tensor:
    """sum(dL/dz . (z' - z)) per head of one batch with layer `drop`'s residual write detached
    (drop = n_layers: nothing dropped): [n_layers, n_heads]."""
    adapter = adapter_for(model)
    ctx = adapter.context(*evalset.batch(rows))
    zs, probes = [], []

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros_like(z, requires_grad=True)  # [batch, pos, head, d_head]
        zs.append(z.detach())
        probes.append(probe)
        return z + probe

    with torch.enable_grad(), z_edit_hooks(model, edit):
        resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
        for layer in range(adapter.n_layers):
            after = adapter.block(layer, resid, ctx)  # [batch, pos, d_model]
            resid = resid + (after - resid).detach() if layer == drop else after
        grads = torch.autograd.grad(unit_sums(adapter, resid, evalset, rows).sum(), probes, allow_unused=True)
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    for layer, (z, grad) in enumerate(zip(zs, grads, strict=True)):
        if grad is not None:
            change = z_change(z, layer_replacement(reps[layer], rows, z.shape[1]))  # [batch, pos, head, d_head]
            out[layer] = (grad * change).sum((0, 1, 3)).double().cpu()
    return out
