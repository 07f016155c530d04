"""Induction heads (Olsson et al. 2022, arXiv 2209.11895): prefix matching and copying.

Prefix matching: from a token [A] attend to the token [B] that followed an earlier [A]
(pattern [A][B] ... [A] -> [B]). The target set equals TransformerLens `detect_head`'s
induction pattern: the duplicate-token pattern shifted one key to the right.
"""

from __future__ import annotations

import torch

from headlens.scores.common import TargetMassReducer
from headlens.scores.duplicate import duplicate_token_reducer, duplicate_token_targets

__all__ = ["duplicate_token_reducer", "duplicate_token_targets", "prefix_matching_reducer", "prefix_matching_targets"]


def prefix_matching_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """T[b, q, k] = token[q] == token[k-1] and k-1 < q: [batch, q_pos, k_pos] bool."""
    dup = duplicate_token_targets(input_ids)  # [batch, q_pos, k_pos]
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]  # key k targets when key k-1 duplicates the query
    return shifted


def prefix_matching_reducer(n_layers: int, n_heads: int, layers=None, n_units: int = 0) -> TargetMassReducer:
    """Reducer for prefix_matching_score: mean attention mass on prefix-matching targets,
    over queries that have at least one target (on repeated random tokens: the later repeats)."""
    return TargetMassReducer(
        n_layers, n_heads, lambda b: prefix_matching_targets(b.input_ids), layers=layers, n_units=n_units
    )
