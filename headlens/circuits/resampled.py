"""The score matrices behind discovery's stability figure (headlens.circuits.discover.stability).

- RESAMPLES bootstrap resamples of the task's sequences (`resample_rows`). EAP's and EAP-IG's score under
  patching is a sum of each sequence's own terms, so each resample's scores come from the task's own passes
  (`scored`: GraphTask.scores' `draws`, each sequence weighted by how often it is drawn); exact scoring and
  mean ablation (whose reference is the resample's own mean) score each resample as a task of its own.
- Two template sets (headlens.circuits.variants), each scored on its own GraphTask, one at a time
  (`template_scores`), before the task's own is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.tasks import take_rows

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

RESAMPLES = 5


def resample_rows(n: int, seed: int) -> list[torch.Tensor]:
    """The RESAMPLES bootstrap draws of a task's n sequences: each [n] row indices, repeats allowed."""
    gen = torch.Generator().manual_seed(seed + 7)
    return [torch.randint(n, (n,), generator=gen) for _ in range(RESAMPLES)]


def scored(gt: GraphTask, method: str, steps: int, seed: int | None = None):
    """`gt`'s edge scores and, with a `seed`, each bootstrap resample's (resample_rows; None without): by
    EAP and EAP-IG under patching from the same passes (GraphTask.scores' `draws`), otherwise each
    resampled task scored anew."""
    if seed is None:
        return gt.scores(method, steps), None
    n = gt.task.tokens.shape[0]
    rows = resample_rows(n, seed)
    if method == "exact" or gt.ablation != "patching":
        again = [GraphTask(gt.loaded, take_rows(gt.task, r), gt.ablation).scores(method, steps) for r in rows]
        return gt.scores(method, steps), again
    draws = torch.stack([torch.ones(n, dtype=torch.long), *(torch.bincount(r, minlength=n) for r in rows)])  # [W, n]
    every = gt.scores(method, steps, draws=draws)  # [W, senders, receivers]
    return every[0], list(every[1:])


def template_scores(loaded: LoadedModel, variants, method, ablation, steps) -> list[torch.Tensor] | None:
    """Each task of `variants` (or None) scored on its own graph task, one at a time: [senders, receivers]
    each. A variant's reference runs are freed before the next is built, and discover scores them before
    the task's own, so no two tasks' reference runs are held at once."""
    if variants is None:
        return None
    return [GraphTask(loaded, v, ablation).scores(method, steps) for v in variants]
