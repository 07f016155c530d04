"""Gradient views of ablation: attribution patching and Michel et al.'s head importance.

Both put a differentiable gate on each head's z (the input of the output projection, through
the architecture adapter's `hook_z`; transformers 5 has no `head_mask`, so the gate is our own
hook) and take one forward and one backward pass.
Weights never require grad here, so the backward pass computes activation gradients only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from headlens import distributed
from headlens.ablation.replace import Replacement, layer_replacement
from headlens.ablation.runner import scored_values
from headlens.arch import adapter_for

GRAD_BATCH_SIZE = 4  # sequences per forward + backward pass


@contextlib.contextmanager
def z_edit_hooks(model, edit: Callable[[int, torch.Tensor], torch.Tensor]):
    """Within the block, layer L's z becomes edit(L, z), z: [batch, pos, head, d_head];
    weights are frozen (requires_grad False) and restored on exit."""
    handles, frozen = [], []
    for param in model.parameters():
        if param.requires_grad:
            frozen.append(param)
            param.requires_grad_(False)

    adapter = adapter_for(model)
    try:
        for layer in range(adapter.n_layers):
            handles.append(adapter.hook_z(layer, lambda z, layer=layer: edit(layer, z)))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for param in frozen:
            param.requires_grad_(True)


def scored_with_grad(model, evalset, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's value at every scored position of one batch, with grad: [n_scored], and
    the sequence (within the batch) of each: [n_scored].

    The trunk runs whole (it applies the final norm); only scored positions go through the
    unembedding, a vocabulary chunk at a time (headlens.ablation.unembed: one logits copy for
    backward instead of autograd's logits, log_softmax and their gradients)."""
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    ids, mask = evalset.input_ids[rows].to(device), evalset.mask[rows].to(device)  # [batch, pos]
    hidden = adapter.run_trunk(ids, mask)  # [batch, pos, d_model]
    seq, pos = torch.nonzero(evalset.counted[rows].to(device), as_tuple=True)  # scored (sequence, position) pairs
    return scored_values(hidden[seq, pos], adapter.unembed(), evalset, rows, seq, pos), seq


def attribution_deltas(model, evalset, reps: list[Replacement], batch_size: int = GRAD_BATCH_SIZE) -> torch.Tensor:
    """Linear estimate of every single-head ablation delta of the metric's mean: [n_layers, n_heads].

    Attribution patching (Nanda 2023; Syed et al. 2023, arXiv 2310.10348): with
    z_h' = z_h + a_h (r_h - z_h), dLoss/da_h at a = 0 is sum(grad_z_h * (r_h - z_h)), the
    first-order change when z_h is replaced by r_h; for zero ablation -sum(grad_z_h * z_h).
    It misses saturated attention and nonlinear effects: check it against the exact sweep.
    """
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    n_seq = evalset.input_ids.shape[0]
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    for start in range(0, n_seq, batch_size):
        rows = slice(start, min(start + batch_size, n_seq))
        alphas = [torch.zeros(n_heads, requires_grad=True) for _ in range(n_layers)]  # [head] per layer

        def edit(layer: int, z: torch.Tensor, rows=rows, alphas=alphas) -> torch.Tensor:
            rep = layer_replacement(reps[layer], rows)
            new = torch.zeros_like(z) if rep is None else rep.to(z.dtype).expand_as(z)
            return z + alphas[layer].to(z.device)[None, None, :, None] * (new - z)  # [batch, pos, head, d_head]

        with torch.enable_grad(), z_edit_hooks(model, edit):
            total_value = scored_with_grad(model, evalset, rows)[0].sum()
            grads = torch.autograd.grad(total_value, alphas)
        total += torch.stack(grads).double().cpu()
    return (total / evalset.n_tokens).float()


def head_importance(model, evalset, keep: torch.Tensor, batch_size: int = GRAD_BATCH_SIZE,
                    shard_batches: bool = False) -> torch.Tensor:
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
    starts = enumerate(range(0, n_seq, batch_size))
    parts = {}  # batch index -> (0, its summed |gradients| [layer, head]) when sharded
    for index, start in (distributed.shard(starts) if shard_batches else starts):
        rows = slice(start, min(start + batch_size, n_seq))
        n_rows = rows.stop - rows.start
        gates = [keep[layer].float().repeat(n_rows, 1).requires_grad_(True)  # [batch, head]
                 for layer in range(n_layers)]

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
