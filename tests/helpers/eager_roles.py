"""Head-role scores computed from Hugging Face eager attention (`output_attentions=True`) and plain
arithmetic, sharing no code with headlens.capture or headlens.scores: the independent side of
tests/test_training_evaluate.py's cross-check and of benchmarks/measure_roles.py's model-card figures."""

from __future__ import annotations

import torch

from headlens.scores.induction import prefix_matching_targets

RETRIEVED_RECALL = 0.5  # Wu et al. 2024: a test counts when > 50% of the needle is retrieved


def eager_patterns(model, ids: torch.Tensor) -> torch.Tensor:
    """Patterns [n_layers, n, head, q_pos, k_pos] of ids [n, pos] from output_attentions."""
    with torch.no_grad():
        return torch.cat([torch.stack(model(input_ids=b, output_attentions=True).attentions) for b in ids.split(16)], 1)


def prev_token_scores(patterns: torch.Tensor) -> torch.Tensor:
    """Mean A[i, i-1] over queries i >= 1: [n_layers, n_heads]."""
    return patterns.diagonal(offset=-1, dim1=-2, dim2=-1).double().mean((1, 3))  # [n_layers, n_heads]


def second_copy_induction_scores(patterns: torch.Tensor, ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Mean mass on prefix-matching targets over second-copy queries of [BOS, c, c]: [n_layers, n_heads]."""
    targets = prefix_matching_targets(ids)  # [n, q_pos, k_pos]: the paper's definition, a boolean mask
    scored = targets.any(-1)  # [n, q_pos]
    scored[:, : 1 + seq_len] = False
    mass = (patterns * targets[None, :, None]).sum(-1).double()  # [n_layers, n, head, q_pos]
    return (mass * scored[None, :, None]).sum((1, 3)) / scored.sum()  # [n_layers, n_heads]


def arena_induction_scores(patterns: torch.Tensor, seq_len: int) -> torch.Tensor:
    """ARENA's induction score: mean of pattern.diagonal(offset=1 - seq_len): [n_layers, n_heads]."""
    return patterns.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1).double().mean((1, 3))  # [n_layers, n_heads]


def needle_retrieval(model, tests) -> tuple[int, torch.Tensor]:
    """(tests retrieved, Wu et al.'s retrieval score [n_layers, n_heads], 0 where none is retrieved), each
    test decoded greedily with one full eager forward per token."""
    per_test = []
    for test in tests:
        ids = torch.tensor([test.prompt])  # [1, pos]
        span = range(test.needle_start, test.needle_start + len(test.needle))
        hits, correct, asked = 0, 0, len(test.needle) - test.restate
        for step in range(asked):
            with torch.no_grad():
                out = model(input_ids=ids, output_attentions=True)
            w = int(out.logits[0, -1].argmax())
            correct += w == test.needle[test.restate + step]
            keys = torch.stack(out.attentions)[:, 0, :, -1].argmax(-1)  # [n_layers, n_heads]
            inside = (keys >= span.start) & (keys < span.stop)
            hits = hits + (inside & (ids[0][keys] == w) & (w in test.needle)).long()  # [n_layers, n_heads]
            ids = torch.cat([ids, torch.tensor([[w]])], dim=1)  # [1, pos + 1]
        if correct / asked > RETRIEVED_RECALL:
            per_test.append(hits.double() / asked)
    if not per_test:
        return 0, torch.zeros(model.config.num_hidden_layers, model.config.num_attention_heads, dtype=torch.float64)
    return len(per_test), torch.stack(per_test).mean(0)
