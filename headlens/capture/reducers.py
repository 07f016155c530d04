"""Reducers and batches: what capture hands activations to, and the checks it applies.

A reducer folds one layer of one batch into running statistics and keeps nothing else, so
scoring every head over many sequences never holds more than one layer's pattern of one batch
(`run_with_cache` on GPT-2 small at 1024 tokens holds ~1.2 GB per sequence).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headlens.errors import CaptureError

PATTERN_CHECK_ATOL = 1e-4
# Half-precision models round each weight to ~eps(dtype) (1e-3 in float16, 8e-3 in bfloat16):
# the check allows this many of their epsilons, still far below a missing mask's ~0.5 per row.
PATTERN_CHECK_EPS = 10


def check_atol(dtype: torch.dtype, base: float = PATTERN_CHECK_ATOL, eps_multiple: float = PATTERN_CHECK_EPS) -> float:
    """Tolerance of a sanity check on tensors of `dtype`: `base` for float32, looser for half precision."""
    return max(base, eps_multiple * torch.finfo(dtype).eps) if dtype.is_floating_point else base


@dataclass
class Batch:
    """One batch of right-padded token sequences."""

    input_ids: torch.Tensor  # [batch, pos] token ids; padding positions hold any valid id
    mask: torch.Tensor  # [batch, pos] bool, True on real tokens (a prefix of each row)
    index: int = 0  # batch number within the run
    offset: int = 0  # index of this batch's first sequence within the run


class Reducer:
    """Base class: override `update`; set `wants` to the activations needed.

    `update(layer, batch, pattern=None, z=None)` is called once per captured layer, batch and
    wanted kind (a reducer wanting both gets one call with `pattern`, one with `z`); pattern is
    [batch, head, q_pos, k_pos], z is [batch, pos, head, d_head]. Padded query rows are
    present: mask them with `batch.mask`. Do not keep references: reduce and drop.

    A reducer that sets `row_blocks = True` may instead be handed each layer's pattern in
    blocks of query rows, `update(layer, batch, pattern=block, q_start=q0)` with block
    [batch, head, rows, k_pos] holding rows q0..q0+rows-1, in order, covering every row (the
    lean path, headlens.capture.lean); without `q_start` the pattern is whole.
    """

    wants: frozenset[str] = frozenset({"pattern"})
    layers: Sequence[int] | None = None  # None: every layer
    row_blocks: bool = False  # True: accepts pattern blocks of query rows (see above)

    def update(
        self, layer: int, batch: Batch, pattern: torch.Tensor | None = None, z: torch.Tensor | None = None
    ) -> None:
        raise NotImplementedError  # abstract: subclasses define the statistic


class CollectPatterns(Reducer):
    """Keeps full patterns (for tests and small inputs only): patterns[layer] is a list per batch."""

    def __init__(self, wants=("pattern",), layers=None):
        self.wants = frozenset(wants)
        self.layers = layers
        self.patterns: dict[int, list[torch.Tensor]] = {}
        self.zs: dict[int, list[torch.Tensor]] = {}

    def update(self, layer, batch, pattern=None, z=None):
        if pattern is not None:
            self.patterns.setdefault(layer, []).append(pattern.detach().clone())
        if z is not None:
            self.zs.setdefault(layer, []).append(z.detach().clone())


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: returns input_ids [batch, pos] and mask [batch, pos] (bool)."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(sequences), longest), dtype=torch.bool)  # [batch, pos]
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = True
    return ids, mask


def iter_batches(
    sequences: Sequence[Sequence[int]] | torch.Tensor, batch_size: int, pad_id: int = 0
) -> Iterator[Batch]:
    """Split sequences (a list of token lists, or a [n, pos] tensor) into right-padded Batches."""
    for index, start in enumerate(range(0, len(sequences), batch_size)):
        chunk = sequences[start : start + batch_size]
        if isinstance(chunk, torch.Tensor):
            ids, mask = chunk.long(), torch.ones_like(chunk, dtype=torch.bool)
        else:
            ids, mask = pad_batch(chunk, pad_id)
        yield Batch(ids, mask, index=index, offset=start)


def check_pattern(pattern: torch.Tensor, mask: torch.Tensor, layer: int, q_start: int = 0) -> None:
    """Raise CaptureError unless the pattern is a causal, row-stochastic attention pattern.

    It catches an attention implementation that drops the causal mask or the softmax. Checked on
    real (unpadded) query rows: every weight >= -atol; every row sums to 1 within atol; the mass
    above the diagonal, averaged over a sequence's rows, is <= atol per head. The last test is an
    average because it is computed as (total mass) - (mass on and below the diagonal), the second
    as one matrix-vector product, several times cheaper than an explicit upper triangle; a missing
    causal mask puts ~0.5 per row above the diagonal, far above the tolerance.
    pattern: [batch, head, rows, k_pos], query rows q_start.. (a whole pattern: q_start 0, rows
    = k_pos); mask: [batch, pos], a prefix of True per row.
    """
    p = pattern.detach()
    if p.numel() == 0:
        return
    atol = check_atol(p.dtype)
    if p.amin().item() < -atol:
        raise CaptureError(f"layer {layer}: attention pattern has negative weights")
    n_rows, n_keys = p.shape[-2], p.shape[-1]
    rows = p.sum(-1, dtype=torch.float32)  # [batch, head, rows]
    real = mask.to(rows.device)[:, q_start : q_start + n_rows]  # [batch, rows]
    lower = torch.ones(n_rows, n_keys, dtype=p.dtype, device=p.device).tril(q_start)  # [rows, k_pos]: k <= q
    for row, n_real in enumerate(real.sum(-1).tolist()):
        if n_real == 0:
            continue
        block = p[row, :, :n_real, :].reshape(p.shape[1], -1)  # [head, n_real * k_pos] (a view)
        on_or_below = block @ lower[:n_real].reshape(-1)  # [head]
        above = rows[row, :, :n_real].sum(-1) - on_or_below  # [head] mass above the diagonal
        if above.amax().item() > atol * n_real:
            raise CaptureError(f"layer {layer}: attention pattern is not causal (weight above the diagonal)")
    if ((rows - 1).abs() * real[:, None, :]).amax().item() > atol:
        raise CaptureError(f"layer {layer}: attention rows do not sum to 1")
