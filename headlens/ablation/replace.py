"""What an ablated head's z becomes: zero, the mean over a reference set, or a resampled z."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from headlens.ablation.runner import LayerRunner
from headlens.arch import adapter_for
from headlens.errors import ConfigError

Replacement = torch.Tensor | None  # per layer: [n_seq, pos, head, d_head], [1, 1, head, d_head] or None (zero)


def capture_z(model, input_ids: torch.Tensor, mask: torch.Tensor, batch_size: int,
              on_z: Callable[[int, slice, torch.Tensor], None]) -> None:
    """Run a set of sequences layer by layer; call on_z(layer, rows, z [batch, pos, head, d_head])."""
    n_layers = adapter_for(model).n_layers
    with torch.no_grad():
        for start in range(0, input_ids.shape[0], batch_size):
            rows = slice(start, min(start + batch_size, input_ids.shape[0]))
            runner = LayerRunner(model, input_ids[rows], mask[rows])
            resid = runner.embed()
            for layer in range(n_layers):
                z, out = runner.attention(layer, resid)
                on_z(layer, rows, z)
                resid = runner.finish_block(layer, resid, out)


def _reference(evalset) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Reference ids and mask, and whether they are the evaluation set itself."""
    if evalset.reference_ids is None:
        return evalset.input_ids, evalset.mask, True
    return evalset.reference_ids, evalset.reference_mask, False


def replacements(model, evalset, method: str, seed: int, batch_size: int) -> list[Replacement]:
    """What z_h becomes under `method`, per layer, for the evaluation sequences.

    zero -> None. mean -> the mean of z over every real position of the reference set,
    [1, 1, head, d_head] (mean ablation, Wang et al. 2022, taken over positions as well).
    resample -> for each evaluation position, z at a reference position drawn uniformly (seeded),
    [n_seq, pos, head, d_head]: from another sequence when the reference is the evaluation set
    itself and holds several, else from another position (resample ablation, Chan et al. 2022).
    """
    n_layers = adapter_for(model).n_layers
    if method == "zero":
        return [None] * n_layers
    ref_ids, ref_mask, same = _reference(evalset)
    if method == "mean":
        sums: list = [0.0] * n_layers

        def add(layer: int, rows: slice, z: torch.Tensor) -> None:
            keep = ref_mask[rows].to(z.device)  # [batch, pos]
            sums[layer] = sums[layer] + z[keep].double().sum(0)  # [head, d_head]

        capture_z(model, ref_ids, ref_mask, batch_size, add)
        n = int(ref_mask.sum())
        return [(total / n).float()[None, None] for total in sums]  # [1, 1, head, d_head] per layer
    src_seq, src_pos = _resample_sources(evalset.mask, ref_mask, same, seed)  # [n_seq, pos] each
    out: list = [None] * n_layers
    needed = torch.unique(src_seq)

    def gather(layer: int, rows: slice, z: torch.Tensor) -> None:
        if out[layer] is None:
            out[layer] = torch.zeros(*evalset.mask.shape, *z.shape[2:], dtype=z.dtype, device=z.device)
        for seq in needed[(needed >= rows.start) & (needed < rows.stop)].tolist():
            at = src_seq == seq  # [n_seq, pos]
            out[layer][at] = z[seq - rows.start][src_pos[at].to(z.device)]

    capture_z(model, ref_ids, ref_mask, batch_size, gather)
    return out


def _resample_sources(mask: torch.Tensor, ref_mask: torch.Tensor, same: bool,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every evaluation position, the reference (sequence, position) it takes z from: two
    [n_seq, pos] long tensors; padding positions get source (0, 0), which they never read."""
    gen = torch.Generator().manual_seed(seed)
    ref_seq, ref_pos = torch.nonzero(ref_mask, as_tuple=True)  # [n_ref_positions]
    eval_seq, eval_pos = torch.nonzero(mask, as_tuple=True)  # [n_eval_positions]
    by_seq = same and int(ref_mask.shape[0]) > 1
    if len(ref_seq) < 2:
        raise ConfigError("resample ablation needs at least 2 reference positions")
    pick = torch.randint(0, len(ref_seq), (len(eval_seq),), generator=gen)  # [n_eval_positions]
    for _ in range(1000):  # redraw collisions with the position itself (or its own sequence)
        bad = ref_seq[pick] == eval_seq if by_seq else (ref_seq[pick] == eval_seq) & (ref_pos[pick] == eval_pos)
        if not same or not bool(bad.any()):
            break
        pick[bad] = torch.randint(0, len(ref_seq), (int(bad.sum()),), generator=gen)
    src_seq = torch.zeros(mask.shape, dtype=torch.long)  # [n_seq, pos]
    src_pos = torch.zeros(mask.shape, dtype=torch.long)  # [n_seq, pos]
    src_seq[eval_seq, eval_pos] = ref_seq[pick]
    src_pos[eval_seq, eval_pos] = ref_pos[pick]
    return src_seq, src_pos


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
