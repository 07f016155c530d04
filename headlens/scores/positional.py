"""Positional heads: previous-token, fixed offset, current-token, first-token sink.

- prev_token_score: mean of A[i, i-1] over positions i >= 1 (Olsson et al. 2022; TransformerLens).
- first_token_score: mean over queries of A[t, 0] (Gu et al. 2024, arXiv 2410.10781: a sink if > 0.3).
"""

from __future__ import annotations

import torch

from headlens.capture import Reducer
from headlens.scores.common import TargetMassReducer


def offset_targets(input_ids: torch.Tensor, offset: int) -> torch.Tensor:
    """Key k = q + offset for each query q (offset <= 0): [batch, q_pos, k_pos] bool."""
    n = input_ids.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=input_ids.device).roll(offset, dims=1)  # [q_pos, k_pos]
    if offset < 0:
        eye[:-offset] = False  # queries before |offset| have no such key (roll wrapped them)
    return eye[None].expand(input_ids.shape[0], n, n)


def offset_mass(pattern: torch.Tensor, offset: int, q_start: int = 0) -> torch.Tensor:
    """A[q, q + offset] for each query row (0 where that key does not exist): [batch, head, rows].

    pattern: [batch, head, rows, k_pos], query rows q_start..; equals
    (pattern * offset_targets(ids, offset)[:, q_start:q_start + rows]).sum(-1) without the [q, k] product."""
    mass = torch.zeros(pattern.shape[:-1], dtype=pattern.dtype, device=pattern.device)  # [batch, head, rows]
    diag = pattern.diagonal(offset=q_start + offset, dim1=-2, dim2=-1)  # [batch, head, rows with that key]
    mass[..., mass.shape[-1] - diag.shape[-1] :] = diag  # the first rows lack the key only when q_start + offset < 0
    return mass


def prev_token_reducer(n_layers: int, n_heads: int, layers=None, n_units: int = 0) -> TargetMassReducer:
    """Reducer for prev_token_score: mean A[i, i-1] over real positions i >= 1."""
    return TargetMassReducer(
        n_layers,
        n_heads,
        lambda b: offset_targets(b.input_ids, -1),
        layers=layers,
        mass_fn=lambda pattern, q_start: offset_mass(pattern, -1, q_start),
        scored_fn=lambda b: _from_position(b, 1),
        n_units=n_units,
    )


def current_token_reducer(n_layers: int, n_heads: int, layers=None, n_units: int = 0) -> TargetMassReducer:
    """Reducer for current_token_score: mean A[i, i] over real positions i >= 1 (i = 0 is trivially 1)."""
    return TargetMassReducer(
        n_layers,
        n_heads,
        lambda b: offset_targets(b.input_ids, 0),
        query_fn=_from_position_one,
        layers=layers,
        mass_fn=lambda pattern, q_start: offset_mass(pattern, 0, q_start),
        scored_fn=lambda b: _from_position(b, 0),
        n_units=n_units,
    )


def _from_position(batch, first: int) -> torch.Tensor:
    """Queries at positions >= first: [batch, q_pos] bool (the real ones are picked by the caller)."""
    return (torch.arange(batch.mask.shape[1]) >= first)[None].expand_as(batch.mask)  # [batch, q_pos]


def _from_position_one(batch) -> torch.Tensor:
    scored = torch.ones_like(batch.mask)  # [batch, q_pos]
    scored[:, 0] = False
    return scored


def first_token_reducer(n_layers: int, n_heads: int, layers=None, n_units: int = 0) -> TargetMassReducer:
    """Reducer for first_token_score: mean A[t, 0] over real positions t >= 1 (t = 0 is trivially 1)."""

    def first_column(batch):
        n = batch.input_ids.shape[1]
        targets = torch.zeros(batch.input_ids.shape[0], n, n, dtype=torch.bool)
        targets[:, 1:, 0] = True
        return targets

    def first_mass(pattern, q_start):
        mass = pattern[..., 0].clone()  # [batch, head, rows]
        if q_start == 0:
            mass[..., 0] = 0.0  # query 0 has no target (A[0, 0] = 1 trivially)
        return mass

    return TargetMassReducer(
        n_layers,
        n_heads,
        first_column,
        layers=layers,
        mass_fn=first_mass,
        scored_fn=lambda b: _from_position(b, 1),
        n_units=n_units,
    )


class ArgmaxOffsetReducer(Reducer):
    """Where does each head's maximum attention weight fall, relative to the query?

    Voita et al. 2019 (arXiv 1905.09418): a head is positional if for >= 90% of tokens its
    maximum weight falls on one fixed relative position. For a causal model offsets are <= 0
    (-1 previous token, 0 current token, -k fixed offset). As Voita excluded the EOS column, the
    BOS / position-0 column is excluded from the argmax (many GPT-2 heads park mass there).
    Queries q >= 2 are scored (with position 0 excluded, q = 1 sees only itself).
    Offsets from -max_offset to 0 get their own bucket; anything further back shares one.
    `result()` -> (dominant_offset [n_layers, n_heads] long, share [n_layers, n_heads] float).
    With `n_units`, each sequence's bucket counts and scored queries are kept too (`unit_counts`,
    `unit_n`, rows by the batch's offset): the bootstrap's units (headlens.classify.stability).
    """

    wants = frozenset({"pattern"})
    row_blocks = True  # takes patterns in blocks of query rows (capture.Reducer)
    totals = ("counts", "n_scored")  # added over processes (headlens.distributed.all_reduce_totals)

    def __init__(self, n_layers: int, n_heads: int, max_offset: int = 8, layers=None, n_units: int = 0):
        self.layers = layers
        self.max_offset = max_offset
        # counts[layer, head, j]: j = -offset for offsets 0..-max_offset, j = max_offset + 1 for "further"
        self.counts = torch.zeros(n_layers, n_heads, max_offset + 2, dtype=torch.long)
        self.n_scored = torch.zeros(n_layers, dtype=torch.long)  # [layer]
        self.unit_counts = torch.zeros(n_layers, n_units, n_heads, max_offset + 2)  # [layer, unit, head, bucket]
        self.unit_n = torch.zeros(n_layers, n_units)  # [layer, unit]
        if n_units:
            self.totals = (*type(self).totals, "unit_counts", "unit_n")

    def update(self, layer, batch, pattern=None, z=None, q_start: int = 0):
        n_rows, n = pattern.shape[-2], pattern.shape[-1]
        if n < 3:
            return
        arg = pattern[..., 1:].argmax(-1) + 1  # [batch, head, rows]; key 0 excluded
        queries = torch.arange(q_start, q_start + n_rows, device=pattern.device)  # [rows]
        back = (queries[None, None, :] - arg).clamp(min=0, max=self.max_offset + 1)  # [batch, head, rows]
        scored = batch.mask[:, q_start : q_start + n_rows].to(pattern.device) & (queries >= 2)  # [batch, rows]
        onehot = torch.nn.functional.one_hot(back, self.max_offset + 2)  # [batch, head, rows, bucket]
        per_unit = (onehot * scored[:, None, :, None]).sum(2)  # [batch, head, bucket]
        self.add_total("counts", layer, per_unit.sum(0))  # on the device
        self.add_total("n_scored", layer, scored.sum())
        if self.unit_n.shape[1]:
            rows = (layer, slice(batch.offset, batch.offset + len(per_unit)))
            self.add_total("unit_counts", rows, per_unit.double())
            self.add_total("unit_n", rows, scored.sum(1).double())

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.flush()
        best = self.counts[..., : self.max_offset + 1].argmax(-1)  # [layer, head] bucket = -offset
        share = self.counts.gather(-1, best[..., None])[..., 0].double() / self.n_scored[:, None].clamp(min=1)
        return -best, share.float()
