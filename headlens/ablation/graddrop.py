"""GradDrop (Kramar et al. 2024, arXiv 2403.00745, AtP*'s second fix): catch effects that cancel.

Attribution patching sums a head's effect over every path to the metric; paths of opposite sign
can cancel in the gradient and hide a head that matters. GradDrop reruns attribution patching
once per layer l with the gradient through layer l's write to the residual stream dropped (the
write keeps its value; only its gradient is zeroed, so paths through l vanish from the estimate)
and scores each head by the mean absolute estimate over the layers after it:
  graddrop(h) = mean_{l > layer(h)} |AtP_{drop l}(h)|     (last-layer heads: |AtP(h)|).
The score is unsigned: it ranks heads for verification (the paper's use), it is not a signed
delta. Cost: one forward and backward pass per layer after the first.
"""

from __future__ import annotations

import torch

from headlens.ablation.attribution import z_edit_hooks
from headlens.ablation.replace import Replacement, layer_replacement
from headlens.ablation.runner import LayerRunner
from headlens.arch import adapter_for

BATCH_SIZE = 4  # sequences per forward + backward pass


def graddrop_scores(model, evalset, reps: list[Replacement], batch_size: int = BATCH_SIZE) -> torch.Tensor:
    """GradDrop score of every head (see the module docstring): [n_layers, n_heads], >= 0."""
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    sums = torch.zeros(n_layers + 1, n_layers, n_heads, dtype=torch.float64)  # [drop (n_layers: none), layer, head]
    n_seq = evalset.input_ids.shape[0]
    for start in range(0, n_seq, batch_size):
        rows = slice(start, min(start + batch_size, n_seq))
        for drop in [*range(1, n_layers), n_layers]:
            sums[drop] += _attribution(model, evalset, rows, reps, drop)
    estimates = (sums / evalset.n_tokens).abs()  # [drop, layer, head]
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
    for layer in range(n_layers):
        later = estimates[layer + 1:n_layers, layer]  # [n_later, head]
        out[layer] = later.mean(0) if len(later) else estimates[n_layers, layer]
    return out.float()


def _attribution(model, evalset, rows: slice, reps, drop: int) -> torch.Tensor:
    """sum(dL/dz . (z' - z)) per head of one batch with layer `drop`'s residual write detached
    (drop = n_layers: nothing dropped): [n_layers, n_heads]."""
    adapter = adapter_for(model)
    runner = LayerRunner(model, evalset.input_ids[rows], evalset.mask[rows])
    zs, probes = [], []

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros_like(z, requires_grad=True)  # [batch, pos, head, d_head]
        zs.append(z.detach())
        probes.append(probe)
        return z + probe

    with torch.enable_grad(), z_edit_hooks(model, edit):
        resid = runner.embed()  # [batch, pos, d_model]
        for layer in range(adapter.n_layers):
            after = runner.block(layer, resid)  # [batch, pos, d_model]
            resid = resid + (after - resid).detach() if layer == drop else after
        grads = torch.autograd.grad(runner.unit_sums(resid, evalset, rows).sum(), probes, allow_unused=True)
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    for layer, (z, grad) in enumerate(zip(zs, grads, strict=True)):
        if grad is not None:
            rep = layer_replacement(reps[layer], rows)
            change = -z if rep is None else rep.to(z.dtype).expand_as(z) - z  # [batch, pos, head, d_head]
            out[layer] = (grad * change).sum((0, 1, 3)).double().cpu()
    return out
