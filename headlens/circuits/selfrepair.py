"""Self-repair: what ablating a set of heads costs in total, what the set wrote directly, and which other
heads make up the difference.

When a head is removed, later components read a different residual stream and write something else:
some take over (the Hydra effect, McGrath et al. 2023, arXiv 2307.15771; Rushing & Nanda 2024, arXiv
2402.15390; copy suppression's share of IOI self-repair, McDougall et al. 2023, arXiv 2310.04625). So a
set's total effect can be far smaller than its direct effect. `self_repair` measures both and the
compensation between them: every head's direct effect on the task's metric (headlens.circuits.direct)
in the clean run and in the ablated run, and the change, largest |change| first. The accounting closes:
the ablated run's linear metric minus the clean one's equals the set's own change plus every other head's
plus the rest's (embeddings, MLPs, biases), each from its own run's frozen norms.

`self_repair` returns a headlens.Result (kind "self_repair"): `.frame` the compensation table, `.meta` the
figures (REPAIR_META); `measure_repair` returns the internal `SelfRepair` it is built from (both runs'
decompositions), which `headlens circuit` reuses.

What the set's z becomes (`method`, as `headlens ablate --method`, headlens.intervene.replace):
- zero: 0;
- mean: its mean over every real position of the reference set: the task's corrupted run where it has
  one (IOI: the ABC prompts, Wang et al. 2022's mean ablation), else the task's own sequences;
- resample: where the task has a corrupted run, its z in that run at the same position (the corrupted
  activation path patching uses); else replace.py's resample from other sequences (seeded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch

from headlens.circuits.direct import Decomposition, decompose
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.intervene.replace import capture_z, replacements
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

METHODS = ("zero", "mean", "resample")
SHOWN = 2  # compensating heads named in the sentence
COMPENSATION_COLUMNS = ["head", "clean", "ablated", "change"]
# A self_repair Result's meta, in this order (the `self_repair` object of a circuit document reads them).
REPAIR_META = (
    "ablated",  # the set's heads ("L.H")
    "method",  # zero | mean | resample
    "unit",  # the metric's unit ("logits", "nats")
    "metric",  # the task's metric's name
    "clean_metric",  # the metric in the clean run
    "ablated_metric",  # the metric with the set ablated
    "total_effect",  # ablated_metric - clean_metric
    "logit_total_effect",  # the change of the metric's linear part
    "direct_effect",  # what the set writes directly in the clean run
    "direct_effect_ablated",  # what it writes once ablated
    "rest_change",  # the embeddings', MLPs' and biases' change
    "compensators",  # the SHOWN heads making up most for the set (same sign as its lost direct effect)
    "sentence",  # the claim in words, with its figures
)


@dataclass
class SelfRepair:
    """One ablated set: the clean and ablated runs' direct effects and what follows from them."""

    ablated: list[Head]
    method: str
    unit: str  # the metric's unit ("logits", "nats")
    metric_name: str
    clean: Decomposition
    after: Decomposition  # the ablated run

    @property
    def total_effect(self) -> float:
        """The task metric's change when the set is ablated (ablated - clean), in `unit`."""
        return self.after.metric - self.clean.metric

    @property
    def logit_total_effect(self) -> float:
        """The change of the metric's linear part (equal to total_effect for a logit difference)."""
        return self.after.logit_metric - self.clean.logit_metric

    @property
    def direct_effect(self) -> float:
        """What the set writes directly in the clean run (sum over its heads)."""
        return sum(self.clean.head(h) for h in self.ablated)

    @property
    def direct_effect_ablated(self) -> float:
        """What the set writes directly once ablated (0 under zero ablation; a mean's own effect under mean)."""
        return sum(self.after.head(h) for h in self.ablated)

    @property
    def rest_change(self) -> float:
        """The change of the embeddings', MLPs' and biases' direct effects."""
        return sum(self.after.rest.values()) - sum(self.clean.rest.values())

    def compensation(self) -> pd.DataFrame:
        """Every other head's direct effect clean and ablated and the change, largest |change| first."""
        change = self.after.heads - self.clean.heads  # [layer, head]
        rows = [
            (str(Head(layer, head)), float(self.clean.heads[layer, head]), float(self.after.heads[layer, head]))
            for layer in range(change.shape[0])
            for head in range(change.shape[1])
            if Head(layer, head) not in self.ablated
        ]
        frame = pd.DataFrame(rows, columns=COMPENSATION_COLUMNS[:3])
        frame["change"] = frame["ablated"] - frame["clean"]
        order = frame["change"].abs().sort_values(ascending=False, kind="stable").index
        return frame.loc[order].reset_index(drop=True)

    def compensators(self, n: int = SHOWN) -> pd.DataFrame:
        """The `n` heads whose change most makes up for the set's lost direct effect (same sign as it)."""
        table = self.compensation()
        lost = self.direct_effect - self.direct_effect_ablated
        same = table[table["change"] * (1.0 if lost >= 0 else -1.0) > 0]
        return same.head(n)

    def sentence(self) -> str:
        """The causal claim in words: what the set writes directly, what ablating it changes in total, and who
        compensates, with the figures."""
        heads = ", ".join(str(h) for h in self.ablated)
        helpers = " and ".join(f"{r.head} ({r.change:+.2f})" for r in self.compensators().itertuples())
        because = f" because {helpers} compensate" if helpers else ""
        linear = "" if self.metric_name != "loss" else f" (its logit part {self.logit_total_effect:+.2f} logits)"
        return (
            f"{heads} write {self.direct_effect:+.2f} logits directly; {self.method}-ablating them changes the "
            f"{self.metric_name} by {self.total_effect:+.2f} {self.unit} in total{linear}{because}"
        )


def replacement_for(
    loaded: LoadedModel, task, heads: list[Head], method: str, seed: int = 0
) -> dict[Head, torch.Tensor | None]:
    """What each ablated head's z becomes under `method` (see the module docstring): head -> None (zero) or a
    tensor broadcastable to [n_seq, pos, d_head] over the task's sequences."""
    if method not in METHODS:
        raise ConfigError(f"unknown ablation method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "zero":
        return dict.fromkeys(heads)
    if method == "resample" and task.corrupted is not None:
        layers = {h.layer for h in heads}
        seen: dict[int, torch.Tensor] = {}

        def keep(layer: int, rows: slice, z: torch.Tensor) -> None:
            if layer in layers:
                part = torch.zeros(z.shape[0], task.tokens.shape[1], *z.shape[2:], dtype=z.dtype)  # [batch, pos, ...]
                part[:, : z.shape[1]] = z.cpu()
                seen[layer] = part if layer not in seen else torch.cat([seen[layer], part])

        capture_z(loaded.model, task.corrupted, task.mask, None, keep)
        return {h: seen[h.layer][:, :, h.head] for h in heads}  # [n_seq, pos, d_head]
    reps = replacements(loaded.model, task.evalset(), method, seed, None)
    out = {}
    for h in heads:
        rep = reps[h.layer][..., h.head, :]  # [1 | n_seq, 1 | pos + 1, d_head]
        out[h] = rep if rep.shape[1] == 1 else rep[:, : task.tokens.shape[1]]
    return out


def self_repair(
    loaded: LoadedModel,
    task,
    heads: list[Head],
    method: str = "zero",
    seed: int = 0,
    clean: Decomposition | None = None,
) -> Result:
    """The set `heads` ablated by `method` on `task` (see the module docstring): a Result of kind "self_repair",
    `.frame` every other head's direct effect clean and ablated and the change (COMPENSATION_COLUMNS, largest
    |change| first), `.meta` the figures (REPAIR_META). `clean` reuses a clean run already decomposed.
    ConfigError for an empty set or a head outside the model."""
    return repair_result(measure_repair(loaded, task, heads, method, seed, clean))


def repair_result(repair: SelfRepair) -> Result:
    """`repair` as a self_repair Result (see `self_repair`)."""
    figures = {
        "ablated": [str(h) for h in repair.ablated],
        "method": repair.method,
        "unit": repair.unit,
        "metric": repair.metric_name,
        "clean_metric": repair.clean.metric,
        "ablated_metric": repair.after.metric,
        "total_effect": repair.total_effect,
        "logit_total_effect": repair.logit_total_effect,
        "direct_effect": repair.direct_effect,
        "direct_effect_ablated": repair.direct_effect_ablated,
        "rest_change": repair.rest_change,
        "compensators": list(repair.compensators()["head"]),
        "sentence": repair.sentence(),
    }
    return Result("self_repair", repair.compensation(), {key: figures[key] for key in REPAIR_META})


def measure_repair(
    loaded: LoadedModel,
    task,
    heads: list[Head],
    method: str = "zero",
    seed: int = 0,
    clean: Decomposition | None = None,
) -> SelfRepair:
    """The set `heads` ablated by `method` on `task`: the clean and ablated decompositions (`clean` reuses a
    clean run already decomposed). ConfigError for an empty set or a head outside the model."""
    if not heads:
        raise ConfigError("--ablate names no head: give heads such as 23.0,23.1")
    n_layers, n_heads = loaded.spec.n_layers, loaded.spec.n_heads
    for h in heads:
        if not (0 <= h.layer < n_layers and 0 <= h.head < n_heads):
            raise ConfigError(f"head {h} is outside this model ({n_layers} layers x {n_heads} heads)")
    clean = clean if clean is not None else decompose(loaded, task)
    after = decompose(loaded, task, replacement_for(loaded, task, heads, method, seed))
    return SelfRepair(list(heads), method, task.unit, task.metric_name, clean, after)
