"""Reducers and batches: what capture hands activations to, and the checks it applies.

A reducer folds one layer of one batch into running statistics and keeps nothing else, so
scoring every head over many sequences never holds more than one layer's pattern of one batch
(`run_with_cache` on GPT-2 small at 1024 tokens holds ~1.2 GB per sequence).

Statistics stay on the model's device while a batch runs (`Reducer.add_total`), and the capture's
checks are computed there too (`pattern_violations`): `flush_to_host` copies all of them to the
host in one transfer after the batch, so a GPU run synchronises with the host once per batch, not
once per layer, head or statistic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headlens.errors import CaptureError

# Devices whose tensors already live in host memory: a reducer adds to its totals at once there
# (no copy, no synchronisation); on any other device the sums wait for `flush_to_host`.
HOST_DEVICES = ("cpu",)
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

    def add_total(self, name: str, index: int, value: torch.Tensor) -> None:
        """Add `value` (a tensor on the model's device) to row `index` of the host tensor attribute
        `name`: at once on a HOST_DEVICES device, else held on the device until the next
        `flush_to_host` (run_capture: after each batch)."""
        if value.device.type in HOST_DEVICES:
            getattr(self, name)[index] += value.to(getattr(self, name).dtype)
            return
        pending = self.__dict__.setdefault("_device_totals", {})
        if name not in pending:
            host = getattr(self, name)
            pending[name] = torch.zeros(host.shape, dtype=torch.float64, device=value.device)  # like the host total
        pending[name][index] += value

    def flush(self) -> None:
        """Bring pending device-side sums into the host totals (call before reading them)."""
        flush_to_host([self])


def flush_to_host(reducers: Sequence, checks: Sequence[tuple[torch.Tensor, object]] = ()) -> None:
    """Add every reducer's pending device-side sums to its host totals and hand each check's
    values (a list of floats) to its callback, all in one copy to the host. Counts travel as
    float64, exact below 2^53."""
    items = [(r, name, buf) for r in reducers for name, buf in r.__dict__.pop("_device_totals", {}).items()]
    if not items and not checks:
        return
    parts = [buf for *_, buf in items] + [value for value, _ in checks]
    flat = torch.cat([part.detach().reshape(-1).to(torch.float64) for part in parts]).tolist()  # the one copy
    offset = 0
    for reducer, name, buf in items:
        total = getattr(reducer, name)
        total += torch.tensor(flat[offset : offset + buf.numel()], dtype=torch.float64).view(buf.shape).to(total.dtype)
        offset += buf.numel()
    for value, then in checks:
        then(flat[offset : offset + value.numel()])
        offset += value.numel()


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
    """Raise CaptureError unless the pattern is a causal, row-stochastic attention pattern
    (`pattern_violations`; this copies its three figures to the host at once)."""
    raise_violations(pattern_violations(pattern, mask, q_start).tolist(), layer)


def pattern_violations(pattern: torch.Tensor, mask: torch.Tensor, q_start: int = 0) -> torch.Tensor:
    """How far the pattern is from a causal, row-stochastic attention pattern, on its device, with
    no host copy: [3] float64, each > 0 where a check fails (`raise_violations` reads them).

    It catches an attention implementation that drops the causal mask or the softmax. Checked on
    real (unpadded) query rows: every weight >= -atol; every row sums to 1 within atol; the mass
    above the diagonal, averaged over a sequence's rows, is <= atol per head. The last is an
    average because it is computed as (total mass) - (mass on and below the diagonal), the mass on
    and below as one contraction with a lower-triangular mask; a missing causal mask puts ~0.5 per
    row above the diagonal, far above the tolerance.
    pattern: [batch, head, rows, k_pos], query rows q_start.. (a whole pattern: q_start 0, rows
    = k_pos); mask: [batch, pos], a prefix of True per row.
    """
    p = pattern.detach()
    if p.numel() == 0:
        return torch.full((3,), -1.0, dtype=torch.float64, device=p.device)
    atol = check_atol(p.dtype)
    n_rows, n_keys = p.shape[-2], p.shape[-1]
    rows = p.sum(-1, dtype=torch.float32)  # [batch, head, rows]
    real = mask.to(rows.device)[:, q_start : q_start + n_rows]  # [batch, rows]
    lower = torch.ones(n_rows, n_keys, dtype=p.dtype, device=p.device).tril(q_start)  # [rows, k_pos]: k <= q
    on_or_below = torch.einsum("bhrk,rk->bhr", p, lower).float()  # [batch, head, rows]
    above = ((rows - on_or_below) * real[:, None, :]).sum(-1)  # [batch, head] mass above the diagonal
    n_real = real.sum(-1)  # [batch]
    return torch.stack(
        [
            -p.amin().double() - atol,
            (above - atol * n_real[:, None]).amax().double(),
            ((rows - 1).abs() * real[:, None, :]).amax().double() - atol,
        ]
    )  # [3]


def raise_violations(found: list[float], layer: int) -> None:
    """Raise CaptureError for the first failed check of `pattern_violations` (its 3 values)."""
    negative, above, rows = found
    if negative > 0:
        raise CaptureError(f"layer {layer}: attention pattern has negative weights")
    if above > 0:
        raise CaptureError(f"layer {layer}: attention pattern is not causal (weight above the diagonal)")
    if rows > 0:
        raise CaptureError(f"layer {layer}: attention rows do not sum to 1")
