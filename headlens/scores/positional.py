"""Positional heads: previous-token, fixed offset, current-token, first-token sink.

- prev_token_score: mean of A[i, i-1] over positions i >= 1 (Olsson et al. 2022; TransformerLens).
- first_token_score: mean over queries of A[t, 0] (Gu et al. 2024, arXiv 2410.10781: a sink if > 0.3).
"""

from __future__ import annotations

import torch

from headlens.scores.common import TargetMassReducer


def offset_targets(input_ids: torch.Tensor, offset: int) -> torch.Tensor:
    """Key k = q + offset for each query q (offset <= 0): [batch, q_pos, k_pos] bool."""
    n = input_ids.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=input_ids.device).roll(offset, dims=1)  # [q_pos, k_pos]
    if offset < 0:
        eye[: -offset] = False  # queries before |offset| have no such key (roll wrapped them)
    return eye[None].expand(input_ids.shape[0], n, n)


def offset_mass(pattern: torch.Tensor, offset: int) -> torch.Tensor:
    """A[q, q + offset] for each query (0 where that key does not exist): [batch, head, q_pos].
    Equals (pattern * offset_targets(ids, offset)).sum(-1) without the [q, k] product."""
    mass = torch.zeros(pattern.shape[:-1], dtype=pattern.dtype, device=pattern.device)  # [batch, head, q_pos]
    mass[..., -offset:] = pattern.diagonal(offset=offset, dim1=-2, dim2=-1)  # [batch, head, q_pos + offset]
    return mass


def prev_token_reducer(n_layers: int, n_heads: int, layers=None) -> TargetMassReducer:
    """Reducer for prev_token_score: mean A[i, i-1] over real positions i >= 1."""
    return TargetMassReducer(n_layers, n_heads, lambda b: offset_targets(b.input_ids, -1), layers=layers,
                             mass_fn=lambda pattern: offset_mass(pattern, -1))


def current_token_reducer(n_layers: int, n_heads: int, layers=None) -> TargetMassReducer:
    """Reducer for current_token_score: mean A[i, i] over real positions i >= 1 (i = 0 is trivially 1)."""
    return TargetMassReducer(n_layers, n_heads, lambda b: offset_targets(b.input_ids, 0),
                             query_fn=_from_position_one, layers=layers,
                             mass_fn=lambda pattern: offset_mass(pattern, 0))


def _from_position_one(batch) -> torch.Tensor:
    scored = torch.ones_like(batch.mask)  # [batch, q_pos]
    scored[:, 0] = False
    return scored


def first_token_reducer(n_layers: int, n_heads: int, layers=None) -> TargetMassReducer:
    """Reducer for first_token_score: mean A[t, 0] over real positions t >= 1 (t = 0 is trivially 1)."""

    def first_column(batch):
        n = batch.input_ids.shape[1]
        targets = torch.zeros(batch.input_ids.shape[0], n, n, dtype=torch.bool)
        targets[:, 1:, 0] = True
        return targets

    def first_mass(pattern):
        mass = pattern[..., 0].clone()  # [batch, head, q_pos]
        mass[..., 0] = 0.0  # query 0 has no target (A[0, 0] = 1 trivially)
        return mass

    return TargetMassReducer(n_layers, n_heads, first_column, layers=layers, mass_fn=first_mass)


class ArgmaxOffsetReducer:
    """Where does each head's maximum attention weight fall, relative to the query?

    Voita et al. 2019 (arXiv 1905.09418): a head is positional if for >= 90% of tokens its
    maximum weight falls on one fixed relative position. For a causal model offsets are <= 0
    (-1 previous token, 0 current token, -k fixed offset). As Voita excluded the EOS column, the
    BOS / position-0 column is excluded from the argmax (many GPT-2 heads park mass there).
    Queries q >= 2 are scored (with position 0 excluded, q = 1 sees only itself).
    Offsets from -max_offset to 0 get their own bucket; anything further back shares one.
    `result()` -> (dominant_offset [n_layers, n_heads] long, share [n_layers, n_heads] float).
    """

    wants = frozenset({"pattern"})

    def __init__(self, n_layers: int, n_heads: int, max_offset: int = 8, layers=None):
        self.layers = layers
        self.max_offset = max_offset
        # counts[layer, head, j]: j = -offset for offsets 0..-max_offset, j = max_offset + 1 for "further"
        self.counts = torch.zeros(n_layers, n_heads, max_offset + 2, dtype=torch.long)
        self.n_scored = torch.zeros(n_layers, dtype=torch.long)  # [layer]

    def update(self, layer, batch, pattern=None, z=None):
        n = pattern.shape[-1]
        if n < 3:
            return
        arg = pattern[..., 1:].argmax(-1) + 1  # [batch, head, q_pos]; key 0 excluded
        back = torch.arange(n, device=pattern.device)[None, None, :] - arg  # [batch, head, q_pos], >= 0
        back = back.clamp(min=0, max=self.max_offset + 1)  # q < 2 are not scored
        scored = batch.mask.to(pattern.device).clone()  # [batch, q_pos]
        scored[:, :2] = False
        onehot = torch.nn.functional.one_hot(back, self.max_offset + 2)  # [batch, head, q_pos, bucket]
        self.counts[layer] += (onehot * scored[:, None, :, None]).sum((0, 2)).cpu()
        self.n_scored[layer] += int(scored.sum())

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        best = self.counts[..., : self.max_offset + 1].argmax(-1)  # [layer, head] bucket = -offset
        share = self.counts.gather(-1, best[..., None])[..., 0].double() / self.n_scored[:, None].clamp(min=1)
        return -best, share.float()
