"""The statistics of an ablation: bootstrap units and confidence intervals, summaries, random controls.

Confidence intervals: a paired percentile bootstrap of the change (Efron & Tibshirani 1993). With
at least MIN_SEQUENCES sequences the bootstrap resamples whole sequences; with fewer (one long
window, a short text) it resamples blocks of consecutive scored tokens inside the sequences
(non-overlapping block bootstrap, Kunsch 1989), which keeps short-range dependence within a
block. `unit_label` says which.

Random controls (Wu et al. 2024: knocking out retrieval heads breaks needle retrieval, knocking out
as many random heads barely changes it): head sets with the chosen set's per-layer counts, each
different from the chosen set and from each other. When no more than K such sets exist, all of them
are taken (an exact permutation test); otherwise K are drawn, seeded. The chosen set's change is
placed among theirs: `rank` (1 = the largest absolute change of the sets and the chosen one) and the
p-value (1 + #{|control| >= |chosen|}) / (1 + K) (Phipson & Smyth 2010), whose smallest possible
value `p_min` is 1 / (1 + K).
"""

from __future__ import annotations

import math
from itertools import combinations, product

import torch

from headlens.bounds import parse_count, shown
from headlens.errors import ConfigError
from headlens.heads import Head

N_BOOTSTRAP = 1000  # bootstrap resamples for every CI
MIN_SEQUENCES = 10  # fewer sequences than this: the bootstrap resamples token blocks instead
MAX_BLOCK = 32  # tokens per bootstrap block (fewer when the text has under 20 blocks' worth)


def assign_units(counted: torch.Tensor, metric: str) -> tuple[torch.Tensor, str]:
    """Bootstrap unit of every counted position: [n_seq, pos - 1] long (-1 where not counted),
    and what the units are. Sequences when there are MIN_SEQUENCES of them, else blocks of
    B = min(MAX_BLOCK, max(1, n_tokens // 20)) consecutive counted tokens of a sequence."""
    n_seq = counted.shape[0]
    units = torch.full(counted.shape, -1, dtype=torch.long)  # [n_seq, pos-1]
    noun = "prompts" if metric in ("logit-diff", "prob") or int(counted.sum(1).max()) <= 1 else "sequences"
    if n_seq >= MIN_SEQUENCES or noun == "prompts":
        rows = torch.arange(n_seq)[:, None].expand_as(counted)  # [n_seq, pos-1]
        units[counted] = rows[counted]
        return units, f"{n_seq} {noun}"
    block = min(MAX_BLOCK, max(1, int(counted.sum()) // 20))
    next_unit = 0
    for seq in range(n_seq):
        cols = torch.nonzero(counted[seq])[:, 0]  # [n_counted_seq]
        ids = torch.arange(len(cols)) // block + next_unit  # [n_counted_seq]
        units[seq, cols] = ids
        next_unit = int(ids.max()) + 1 if len(ids) else next_unit
    return units, f"{next_unit} blocks of up to {block} consecutive tokens ({n_seq} sequence{'s' * (n_seq > 1)})"


def bootstrap_ci(
    base_sum: torch.Tensor, ablated_sum: torch.Tensor, counts: torch.Tensor, seed: int, n_boot: int = N_BOOTSTRAP
) -> list[float] | None:
    """Paired 95% percentile CI of the change of the mean, resampling bootstrap units.

    base_sum, ablated_sum, counts: [n_units] per-unit sums of the metric's values and scored
    positions; the same resampled units serve base and ablated (paired). None with < 2 units.
    """
    n = counts.shape[0]
    if n < 2:
        return None
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=gen)  # [n_boot, n_units]
    tokens = counts.double()[idx].sum(1)  # [n_boot]
    delta = (ablated_sum.double()[idx].sum(1) - base_sum.double()[idx].sum(1)) / tokens  # [n_boot]
    low, high = torch.quantile(delta, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [float(low), float(high)]


def head_seed(seed: int, layer: int, head: int) -> int:
    """A bootstrap seed per head that does not depend on sweep order (resume gives equal CIs)."""
    return (seed * 1_000_003 + layer * 1009 + head) % (2**63 - 1)


def summarize(base: torch.Tensor, ablated: torch.Tensor, counts: torch.Tensor, seed: int, loss: bool) -> dict:
    """`n`, `clean`, `ablated`, `delta` (means over scored positions) and the paired bootstrap
    `ci95` (None with fewer than 2 units); with `loss` also `n_tokens`, `loss`, `loss_ablated`,
    `delta_loss` (the same numbers under their loss names)."""
    n = int(counts.sum())
    clean = float(base.double().sum() / n)
    after = float(ablated.double().sum() / n)
    out = {
        "n": n,
        "clean": clean,
        "ablated": after,
        "delta": after - clean,
        "ci95": bootstrap_ci(base, ablated, counts, seed),
    }
    if loss:
        out.update(n_tokens=n, loss=clean, loss_ablated=after, delta_loss=after - clean)
    return out


MAX_CONTROL_SETS = 10_000  # random:K: each set is a full ablation run, so more is never meant


def parse_control(spec: str | None) -> int:
    """K of `random:K` (0 for None); ConfigError otherwise."""
    if spec is None:
        return 0
    kind, _, value = str(spec).partition(":")
    k = parse_count(value)
    if kind.strip() != "random" or k is None or not 1 <= k <= MAX_CONTROL_SETS:
        raise ConfigError(
            f"control {shown(spec)} is not understood: give random:K with 1 <= K <= {MAX_CONTROL_SETS:,} "
            "(e.g. random:20)"
        )
    return k


def _layer_counts(heads: list[Head]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for head in heads:
        counts[head.layer] = counts.get(head.layer, 0) + 1
    return dict(sorted(counts.items()))


def control_design(heads: list[Head], n_heads: int, k: int, seed: int, outside: bool = False) -> dict:
    """The control sets of `heads` (see the module docstring): `sets` (sorted head lists),
    `n_possible` (how many sets with the same per-layer counts differ from the chosen one) and
    `exact` (True when all of them were taken). With `outside`, the sets are drawn from the other
    heads of those layers only: no set shares a head with `heads`, and `n_possible` counts those."""
    counts = _layer_counts(heads)
    chosen = sorted(heads)
    pools = {layer: [h for h in range(n_heads) if not (outside and Head(layer, h) in chosen)] for layer in counts}
    n_possible = math.prod(math.comb(len(pools[layer]), c) for layer, c in counts.items()) - (0 if outside else 1)
    if n_possible <= k:
        every = product(*(combinations(pools[layer], c) for layer, c in counts.items()))
        sets = [
            sorted(Head(layer, h) for layer, picked in zip(counts, choice, strict=True) for h in picked)
            for choice in every
        ]
        return {"sets": [s for s in sets if s != chosen], "n_possible": n_possible, "exact": True}
    gen = torch.Generator().manual_seed(seed)
    sets, seen = [], {tuple(chosen)}
    while len(sets) < k:
        picked = sorted(
            Head(layer, pools[layer][int(i)])
            for layer, c in counts.items()
            for i in torch.randperm(len(pools[layer]), generator=gen)[:c]
        )
        if tuple(picked) not in seen:
            seen.add(tuple(picked))
            sets.append(picked)
    return {"sets": sets, "n_possible": n_possible, "exact": False}


def control_summary(
    chosen: float,
    deltas: list[float],
    sets: list[list[Head]],
    seed: int,
    n_possible: int | None = None,
    exact: bool = False,
) -> dict:
    """Where the chosen set's change falls among the control sets' changes."""
    larger = sum(abs(d) > abs(chosen) for d in deltas)
    at_least = sum(abs(d) >= abs(chosen) for d in deltas)
    return {
        "k": len(deltas),
        "seed": seed,
        "sets": [[str(h) for h in s] for s in sets],
        "deltas": deltas,
        "rank": 1 + larger,
        "p_value": (1 + at_least) / (1 + len(deltas)),
        "n_possible": len(deltas) if n_possible is None else n_possible,
        "exact": exact,
        "p_min": 1 / (1 + len(deltas)),
    }
