"""Duplicate-token heads: attention from a token to earlier copies of the same token.

The target set equals TransformerLens `detect_head`'s `duplicate_token_head` pattern:
1 where token[q] == token[k] and k < q (the diagonal excluded). The IOI circuit (Wang et al.
2022, arXiv 2211.00593) names GPT-2 small's 0.1, 0.10 and 3.0 duplicate-token heads.
"""

from __future__ import annotations

import torch

from headlens.scores.common import TargetMassReducer


def duplicate_token_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """T[b, q, k] = token[q] == token[k] and k < q: [batch, q_pos, k_pos] bool."""
    same = input_ids[:, :, None] == input_ids[:, None, :]  # [batch, q_pos, k_pos]
    return same & torch.ones_like(same[0]).tril(-1)[None]


def duplicate_token_reducer(n_layers: int, n_heads: int, layers=None, n_units: int = 0) -> TargetMassReducer:
    """Reducer for duplicate_token_score: mean attention mass on earlier copies of the query token,
    over queries that have one (on repeated random tokens: every token of the later copies)."""
    return TargetMassReducer(
        n_layers, n_heads, lambda b: duplicate_token_targets(b.input_ids), layers=layers, n_units=n_units
    )
