"""What an ablated head's z becomes: zero, the mean over a reference set, or a resampled z."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlens.ablation.runner import LayerRunner
from headlens.arch import adapter_for
from headlens.errors import ConfigError, InputTextError

Replacement = torch.Tensor | None  # per layer: [n_seq | 1, pos, head, d_head] or None (zero)


def capture_z(model, input_ids: torch.Tensor, mask: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """z of every layer over a set of sequences: list over layers of [n_seq, pos, head, d_head]."""
    per_layer: list[list[torch.Tensor]] = [[] for _ in range(adapter_for(model).n_layers)]
    with torch.no_grad():
        for start in range(0, input_ids.shape[0], batch_size):
            runner = LayerRunner(model, input_ids[start:start + batch_size], mask[start:start + batch_size])
            resid = runner.embed()
            for layer in range(len(per_layer)):
                z, out = runner.attention(layer, resid)
                per_layer[layer].append(z.clone())
                resid = runner.finish_block(layer, resid, out)
    return [torch.cat(chunks) for chunks in per_layer]


def replacements(model, evalset, method: str, seed: int, batch_size: int) -> list[Replacement]:
    """What z_h becomes under `method`, per layer, for the evaluation sequences.

    zero -> None. mean -> the mean of z over the reference set at each position (Wang et al.
    2022, mean ablation), [1, pos, head, d_head]; positions no reference sequence reaches take
    the mean over all reference positions. resample -> z of a reference sequence drawn (seeded)
    for each evaluation sequence among those at least as long, [n_seq, pos, head, d_head].
    """
    n_layers = adapter_for(model).n_layers
    if method == "zero":
        return [None] * n_layers
    if evalset.reference_ids is None:
        raise InputTextError("the text gives a single window: mean and resample ablation need a second window "
                             "as the reference set (give a longer --text)")
    ref_z = capture_z(model, evalset.reference_ids, evalset.reference_mask, batch_size)
    n_pos = evalset.input_ids.shape[1]
    ref_mask = evalset.reference_mask.to(ref_z[0].device)
    if method == "mean":
        return [_mean_z(z, ref_mask, n_pos) for z in ref_z]
    lengths = evalset.mask.sum(1)  # [n_seq]
    ref_lengths = ref_mask.sum(1)  # [n_ref]
    gen = torch.Generator().manual_seed(seed)
    picks = []
    for length in lengths.tolist():
        ok = torch.nonzero(ref_lengths >= length)[:, 0]
        if ok.numel() == 0:
            raise ConfigError(f"resample ablation: no reference sequence has {length} tokens")
        picks.append(int(ok[torch.randint(0, ok.numel(), (1,), generator=gen)]))
    out = []
    for z in ref_z:
        z = z[torch.tensor(picks)][:, :n_pos]  # [n_seq, pos, head, d_head]
        if z.shape[1] < n_pos:
            z = torch.nn.functional.pad(z, (0, 0, 0, 0, 0, n_pos - z.shape[1]))
        out.append(z)
    return out


def _mean_z(z: torch.Tensor, ref_mask: torch.Tensor, n_pos: int) -> torch.Tensor:
    weights = ref_mask.to(z.dtype)[:, :, None, None]  # [n_ref, pos_ref, 1, 1]
    total = (z * weights).sum(0)  # [pos_ref, head, d_head]
    count = weights.sum(0)  # [pos_ref, 1, 1]
    overall = total.sum(0) / count.sum(0)  # [head, d_head]
    mean = torch.where(count > 0, total / count.clamp(min=1), overall)  # [pos_ref, head, d_head]
    if mean.shape[0] < n_pos:
        mean = torch.cat([mean, overall.expand(n_pos - mean.shape[0], *overall.shape)])
    return mean[None, :n_pos]  # [1, pos, head, d_head]


def layer_replacement(rep: Replacement, rows: slice) -> Replacement:
    """The replacement of a layer for a slice of evaluation sequences."""
    if rep is None or rep.shape[0] == 1:
        return rep
    return rep[rows]


def heads_by_layer(heads: Sequence) -> dict[int, list]:
    by_layer: dict[int, list] = {}
    for head in heads:
        by_layer.setdefault(head.layer, []).append(head)
    return by_layer
