"""Previous-token and induction heads of a real model by their attention definitions, and a
permutation test of an edge statistic against random sender sets (the circuits real-model tests
and benchmarks/bench_circuits.py share them).

On repeated random tokens (BOS, then 2 copies of `seq_len` tokens; Olsson et al. 2022):
- previous-token score: mean attention from position i to i - 1 (i >= 2);
- prefix-matching score: mean attention from a second-copy token to the token after its first
  occurrence (the induction target).
A head is a previous-token (induction) head when its score is >= MIN_SCORE.
"""

from __future__ import annotations

import torch

from headlens.heads import Head
from headlens.intervene.stats import control_design
from headlens.probes.inputs import random_token_range, repeated_random_tokens

MIN_SCORE = 0.4  # the classifier's prefix_matching_min (Olsson et al.'s induction criterion), for both roles
SEQ_LEN = 25
N_CONTROLS = 100  # random sender sets: p >= 1 / (N_CONTROLS + 1) ~ 0.0099


def attention_roles(loaded, seed: int = 3, n_seq: int = 4) -> tuple[list[Head], list[Head]]:
    """(previous-token heads, induction heads) by the definitions above."""
    low, high = random_token_range(loaded.spec.d_vocab)
    ids = repeated_random_tokens(n_seq, SEQ_LEN, 2, low, high, loaded.bos_token_id, seed=seed)  # [seq, 51]
    with torch.no_grad():
        patterns = torch.stack(loaded.model(ids, output_attentions=True).attentions)  # [layer, seq, head, q, k]
    q = torch.arange(2, ids.shape[1])
    prev = patterns[..., q, q - 1].mean((1, 3))  # [layer, head]
    second = torch.arange(1 + SEQ_LEN, ids.shape[1])  # second-copy positions
    prefix = patterns[..., second, second - SEQ_LEN + 1].mean((1, 3))  # [layer, head]
    n_heads = loaded.spec.n_heads
    pick = lambda s: [Head(i // n_heads, i % n_heads) for i in (s.flatten() >= MIN_SCORE).nonzero().flatten().tolist()]
    return pick(prev), pick(prefix)


def pair_mean(values: dict, senders: list[Head], receivers: list[Head]) -> float:
    """Mean of values[(sender "L.H", receiver "L.H")] over pairs with the sender in an earlier layer."""
    got = [values[(str(s), str(r))] for s in senders for r in receivers if s.layer < r.layer]
    return sum(got) / len(got)


def permutation_p(values: dict, senders: list[Head], receivers: list[Head], n_heads: int, seed: int = 2) -> dict:
    """pair_mean of `senders` against N_CONTROLS random sets with the same heads per layer
    (headlens.intervene.stats.control_design): p = (1 + #controls >= chosen) / (1 + N_CONTROLS)."""
    sets = [s for s in control_design(senders, n_heads, 2 * N_CONTROLS, seed)["sets"] if s != sorted(senders)]
    sets = sets[:N_CONTROLS]
    chosen = pair_mean(values, senders, receivers)
    controls = [pair_mean(values, s, receivers) for s in sets]
    at_least = sum(c >= chosen for c in controls)
    return {
        "chosen": chosen,
        "control_max": max(controls),
        "control_median": sorted(controls)[len(controls) // 2],
        "n_controls": len(controls),
        "p_value": (1 + at_least) / (1 + len(controls)),
    }
