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


def prev_token_reducer(n_layers: int, n_heads: int, layers=None) -> TargetMassReducer:
    """Reducer for prev_token_score: mean A[i, i-1] over real positions i >= 1."""
    return TargetMassReducer(n_layers, n_heads, lambda b: offset_targets(b.input_ids, -1), layers=layers)


def first_token_reducer(n_layers: int, n_heads: int, layers=None) -> TargetMassReducer:
    """Reducer for first_token_score: mean A[t, 0] over real positions t >= 1 (t = 0 is trivially 1)."""

    def first_column(batch):
        n = batch.input_ids.shape[1]
        targets = torch.zeros(batch.input_ids.shape[0], n, n, dtype=torch.bool)
        targets[:, 1:, 0] = True
        return targets

    return TargetMassReducer(n_layers, n_heads, first_column, layers=layers)
