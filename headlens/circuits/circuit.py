"""`circuit`: one task's circuit as three tables, the library behind `headlens circuit`.

`circuit` returns a headlens.Result of kind "circuit": `.frame` the heads table, `.tables["edges"]` the
edges, `.tables["compensation"]` the self-repair compensation table (with `ablate`), `.meta` what they were
measured on (CIRCUIT_META). `to_document` turns it into the command's JSON document.

- `heads`: every head with its labels (classify, or a labels file), its direct effect on the task's
  metric through the logits (headlens.circuits.direct) and, for the TOTAL_HEADS heads of largest
  |direct effect|, its total effect (the metric's change when that head alone is ablated by `method`);
  `large_unlabelled` marks a head whose |direct effect| is at least LARGE_SHARE of the metric's linear
  part and that carries no role (a property such as first_token is not a role; headlens.classify.kinds.ROLES): no
  kind is invented for it;
- `edges`: the circuit's edges (headlens.circuits.edges): Q/K/V composition from the weights for every
  pair of the chosen heads, exact path patching (headlens.circuits.paths) of each chosen sender into each
  chosen receiver's q, k and v and of each chosen head straight to the logits, and, with `approx`, edge
  attribution (EAP / EAP-IG) on the same edges;
- `self_repair` (with `ablate`): the set's total effect, its own direct effect and the compensation table
  (headlens.circuits.selfrepair).

Which heads are chosen: the receivers are the task's labelled heads (induction: `induction`; IOI: name
movers and negative name movers, copy suppression) and the RECEIVERS heads of largest |direct effect|;
the senders are the labelled heads that feed them (induction: `previous_token`; IOI: `induction`,
`duplicate_token`, `previous_token`) plus, per receiver, the SENDERS_PER_RECEIVER earlier heads of highest
composition z-score. Path patching runs on the task's first PATCH_SEQS sequences (its cost grows with
senders x receivers x inputs: headlens.circuits.paths).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd
import torch

from headlens.circuits.direct import Decomposition, decompose
from headlens.circuits.edges import DIRECT, KEY, VIAS, merge_edges
from headlens.circuits.selfrepair import COMPENSATION_COLUMNS, replacement_for, self_repair
from headlens.circuits.tasks import take_rows
from headlens.classify.kinds import ROLES
from headlens.heads import Head, all_heads
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

LARGE_SHARE = 0.1  # ours: a head writing >= 10% of the metric's linear part directly is large
TOTAL_HEADS = 5  # heads whose total effect is measured (largest |direct effect|)
RECEIVERS = 4  # unlabelled receivers taken by |direct effect|
SENDERS_PER_RECEIVER = 2  # senders taken per receiver by composition z-score
MAX_SENDERS = 8
PATCH_SEQS = 8  # sequences path patching runs on (its cost: BENCHMARKS.md, "headlens circuit")
TOP_ATTRIBUTED = 20  # edges kept from edge attribution beyond the measured ones
RECEIVER_KINDS = {"induction": ("induction",), "ioi": ("name_mover", "negative_name_mover", "copy_suppression")}
SENDER_KINDS = {"induction": ("previous_token",), "ioi": ("induction", "duplicate_token", "previous_token")}
HEAD_COLUMNS = ["head", "layer", "head_index", "labels", "direct_effect", "total_effect", "large_unlabelled"]
# A circuit Result's meta, in this order.
CIRCUIT_META = (
    "model",  # the model's name
    "task",  # task_fields: name, description, metric, unit, clean, logit_metric, direct_effects_unit
    "method",  # how heads are ablated for total effects and path patching
    "large_share",  # LARGE_SHARE
    "rest",  # the clean run's direct effects of the embeddings, MLPs and biases
    "patched_sequences",  # sequences path patching ran on
    "agreement",  # attribution vs exact path patching (with `approx`), else None
    "self_repair",  # the self_repair Result's meta (with `ablate`), else None
)
# The self_repair meta a circuit document's `self_repair` object holds, in its order (then `compensation`).
REPAIR_KEYS = ("ablated", "method", "unit", "total_effect", "logit_total_effect", "direct_effect")
REPAIR_KEYS += ("direct_effect_ablated", "rest_change", "sentence")


def circuit(
    loaded: LoadedModel,
    task,
    labels: dict[Head, list[str]],
    ablate: list[Head] | None = None,
    method: str = "zero",
    approx: str | None = None,
    steps: int = 5,
    seed: int = 0,
    progress: bool = False,
) -> Result:
    """The circuit of `task` on `loaded` (see the module docstring); `labels` head -> its labels. A Result of
    kind "circuit": `.frame` one row per head (HEAD_COLUMNS, largest |direct effect| first); `.tables["edges"]`
    (sender, receiver, via, composition, effect, attribution; largest |effect| first) and, with `ablate`,
    `.tables["compensation"]` (headlens.circuits.selfrepair's COMPENSATION_COLUMNS); `.meta` CIRCUIT_META."""
    clean = decompose(loaded, task)
    totals = _total_effects(loaded, task, clean, method, seed)
    heads = head_frame(clean, labels, totals)
    senders, receivers = chosen_heads(loaded, task.name, heads, labels)
    edges = circuit_edges(loaded, task, senders, receivers, method, seed)
    agreement = None
    if approx is not None:
        edges, agreement = _with_attribution(loaded, task, edges, approx, steps, method, seed)
    repair = self_repair(loaded, task, ablate, method, seed, clean=clean) if ablate else None
    meta = {
        "model": str(loaded.name),
        "task": task_fields(task, clean),
        "method": method,
        "large_share": LARGE_SHARE,
        "rest": dict(clean.rest),
        "patched_sequences": min(PATCH_SEQS, int(task.tokens.shape[0])),
        "agreement": agreement,
        "self_repair": None if repair is None else repair.meta,
    }
    tables = {"edges": edges} if repair is None else {"edges": edges, "compensation": repair.frame}
    return Result("circuit", heads, meta, tables=tables)


def head_frame(clean: Decomposition, labels: dict[Head, list[str]], totals: dict[Head, float]) -> pd.DataFrame:
    """One row per head (HEAD_COLUMNS), largest |direct effect| first."""
    large = LARGE_SHARE * abs(clean.logit_metric)
    n_layers, n_heads = clean.heads.shape
    rows = []
    for head in all_heads(n_layers, n_heads):
        effect = clean.head(head)
        names = list(labels.get(head, []))
        rows.append(
            (
                str(head),
                head.layer,
                head.head,
                names,
                effect,
                totals.get(head, math.nan),
                abs(effect) >= large and not set(names) & set(ROLES),
            )
        )
    frame = pd.DataFrame(rows, columns=HEAD_COLUMNS)
    order = frame["direct_effect"].abs().sort_values(ascending=False, kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def _total_effects(loaded: LoadedModel, task, clean: Decomposition, method: str, seed: int) -> dict[Head, float]:
    """The metric's change when each of the TOTAL_HEADS heads of largest |direct effect| is ablated alone."""
    n_heads = clean.heads.shape[1]
    top = torch.topk(clean.heads.flatten().abs(), TOTAL_HEADS).indices.tolist()
    out = {}
    for index in top:
        head = Head(index // n_heads, index % n_heads)
        after = decompose(loaded, task, replacement_for(loaded, task, [head], method, seed))
        out[head] = after.metric - clean.metric
    return out


def chosen_heads(loaded: LoadedModel, task_name: str, heads: pd.DataFrame, labels: dict[Head, list[str]]):
    """The senders and receivers whose edges are measured (see the module docstring): two sorted lists."""
    from headlens.circuits.composition import composition_scores

    kinds = RECEIVER_KINDS[task_name]
    receivers = {h for h, names in labels.items() if set(names) & set(kinds)}
    receivers |= {Head(int(r.layer), int(r.head_index)) for r in heads.head(RECEIVERS).itertuples()}
    senders = {h for h, names in labels.items() if set(names) & set(SENDER_KINDS[task_name])}
    scores = composition_scores(loaded, receivers=sorted(receivers)).frame
    best = scores.sort_values("composition_z", ascending=False, kind="stable")
    for receiver in sorted(receivers):
        mine = best[best["receiver"] == str(receiver)]
        senders |= {_head(s) for s in mine["sender"].drop_duplicates().head(SENDERS_PER_RECEIVER)}
    senders = sorted(senders, key=lambda h: -_strength(heads, h))[:MAX_SENDERS]
    return sorted(senders), sorted(receivers)


def _strength(heads: pd.DataFrame, head: Head) -> float:
    return float(heads.loc[heads["head"] == str(head), "direct_effect"].abs().iloc[0])


def _head(text: str) -> Head:
    layer, head = text.split(".")
    return Head(int(layer), int(head))


def circuit_edges(
    loaded: LoadedModel, task, senders: list[Head], receivers: list[Head], method: str, seed: int
) -> pd.DataFrame:
    """Composition of every sender -> later receiver pair, and exact path patching of those edges and of every
    chosen head straight to the logits (on the task's first PATCH_SEQS sequences)."""
    from headlens.circuits.composition import composition_scores
    from headlens.circuits.paths import path_patch

    composition = composition_scores(loaded, senders=senders, receivers=receivers).frame
    composition = composition[list(composition.columns[:6])]  # the edge columns
    small = subset(task, PATCH_SEQS)
    into = path_patch(loaded, small, senders=senders, receivers=receivers, via=VIAS, method=method, seed=seed).frame
    direct = path_patch(
        loaded,
        small,
        senders=sorted(set(senders) | set(receivers)),
        receivers=[],
        via=(DIRECT,),
        method=method,
        seed=seed,
    ).frame
    into = into[into["receiver"].isin([str(r) for r in receivers])]
    edges = merge_edges(composition, into, direct)
    order = edges["effect"].abs().fillna(-1.0).sort_values(ascending=False, kind="stable").index
    return edges.loc[order].reset_index(drop=True)


def subset(task, n: int):
    """The task's first `n` sequences as a task of their own."""
    if task.tokens.shape[0] <= n:
        return task
    first = take_rows(task, torch.arange(n))
    return replace(first, description=f"the first {n} of {task.description}", prompts=task.prompts[:n])


def _with_attribution(loaded: LoadedModel, task, edges: pd.DataFrame, approx: str, steps: int, method: str, seed: int):
    """The edges with `attribution` from edge attribution (EAP / EAP-IG, headlens.circuits.attribution) on the
    same sequences as path patching, plus the TOP_ATTRIBUTED edges it ranks highest; and its agreement with
    the exact effects on the edges both measured (Spearman, top-k recall: edge_agreement)."""
    from headlens.circuits.attribution import edge_agreement, edge_attribution

    scored = edge_attribution(loaded, subset(task, PATCH_SEQS), approx, steps=steps, ablation=method, seed=seed).frame
    keys = set(edges[KEY].itertuples(index=False, name=None))
    measured = scored[[key in keys for key in scored[KEY].itertuples(index=False, name=None)]]
    top = scored.reindex(scored["attribution"].abs().sort_values(ascending=False).index).head(TOP_ATTRIBUTED)
    merged = merge_edges(edges, pd.concat([measured, top]).drop_duplicates(subset=KEY)[[*KEY, "attribution"]])
    return merged, edge_agreement(edges.dropna(subset=["effect"]), measured)


def _number(value) -> float | None:
    """A float for JSON: NaN and None become None."""
    return None if value is None or value != value else float(value)


def to_document(result: Result, model: dict | None = None) -> dict:
    """The JSON document of `headlens circuit --format json` (README, "The circuit JSON") of a circuit Result:
    `heads`, `edges`, `self_repair` (null without an ablation), with the task and the clean run's figures;
    `model` describes the model (headlens.reports.facts.model_info)."""
    meta = result.meta
    heads = [
        {
            "head": r.head,
            "labels": list(r.labels),
            "direct_effect": float(r.direct_effect),
            "total_effect": _number(r.total_effect),
            "large_unlabelled": bool(r.large_unlabelled),
        }
        for r in result.frame.itertuples()
    ]
    edges = [
        {
            "sender": r.sender,
            "receiver": r.receiver,
            "via": r.via,
            "composition": _number(r.composition),
            "effect": _number(r.effect),
            "attribution": _number(r.attribution),
        }
        for r in result.tables["edges"].itertuples()
    ]
    repair = meta["self_repair"]
    return {
        "model": model or {},
        "task": meta["task"],
        "method": meta["method"],
        "large_share": meta["large_share"],
        "heads": heads,
        "rest": dict(meta["rest"]),
        "edges": edges,
        "patched_sequences": meta["patched_sequences"],
        "agreement": meta["agreement"],
        "self_repair": None if repair is None else repair_document(repair, result.tables["compensation"]),
    }


def task_fields(task, clean) -> dict:
    """A circuit document's `task`: what was run and the clean model's value on it."""
    return {
        "name": task.name,
        "description": task.description,
        "metric": task.metric_name,
        "unit": task.unit,
        "clean": clean.metric,
        "logit_metric": clean.logit_metric,
        "direct_effects_unit": "logits",
    }


def repair_document(repair: dict, compensation: pd.DataFrame) -> dict:
    """The `self_repair` object of a circuit document from a self_repair Result's meta and frame: the ablated
    set, its total and direct effects, the compensation table."""
    rows = compensation[COMPENSATION_COLUMNS].itertuples(index=False)
    return {
        **{key: repair[key] for key in REPAIR_KEYS},
        "compensation": [{"head": r.head, "clean": r.clean, "ablated": r.ablated, "change": r.change} for r in rows],
    }
