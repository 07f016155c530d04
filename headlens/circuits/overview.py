"""Circuit documents from the weights and a few runs: what the main report's "How the heads work together"
section draws, at a fraction of `headlens circuit`'s cost (no path patching, no per-head total effects).

Per task (induction, and IOI where the tokenizer spells its names as single tokens):
- every head's direct effect on the task's metric through the logits (headlens.circuits.direct, one run of
  the task's first OVERVIEW_SEQS sequences), and `large_unlabelled` as headlens.circuits.circuit marks it;
- the edges into the receivers (the task's labelled receivers, circuit.RECEIVER_KINDS, and the RECEIVERS
  heads of largest |direct effect|) from the labelled senders (circuit.SENDER_KINDS) and from the
  SENDERS_PER_RECEIVER earlier heads of highest composition z-score: Q-, K- and V-composition read from the
  weights (headlens.circuits.composition, all pairs computed once), `effect` None (not measured);
- IOI, where the model does it (a positive clean logit difference): self-repair when the "movers" are
  zero-ablated: the labelled name movers, or else the MOVERS heads of largest positive direct effect
  (headlens.circuits.selfrepair), so the page can draw which heads back them up.
The documents have the shape of headlens.circuits.circuit.to_document's, with `composition_z` on each edge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from headlens.circuits.circuit import (
    LARGE_SHARE,
    RECEIVER_KINDS,
    RECEIVERS,
    SENDER_KINDS,
    head_frame,
    repair_document,
    subset,
    task_fields,
)
from headlens.circuits.composition import composition_scores
from headlens.circuits.direct import decompose
from headlens.circuits.selfrepair import self_repair
from headlens.circuits.tasks import induction_task, ioi_task
from headlens.errors import ConfigError
from headlens.heads import Head

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

OVERVIEW_SEQS = 16  # sequences (prompts) each task runs on
MOVERS = 2  # heads ablated for the self-repair picture when no name mover is labelled
EDGES_PER_RECEIVER = 3  # edges kept per receiver, by composition z-score


def overview_documents(loaded: LoadedModel, labels: dict[Head, list[str]], seed: int = 0) -> list[dict]:
    """One document per task the model can run (module docstring); composition is computed once."""
    composition = composition_scores(loaded).frame
    documents = []
    for build in (induction_task, ioi_task):
        try:
            task = subset(build(loaded, seed=seed), OVERVIEW_SEQS)
        except ConfigError:  # a tokenizer without single-token names, a context too short
            continue
        documents.append(task_document(loaded, task, labels, composition, seed))
    return documents


def task_document(
    loaded: LoadedModel, task, labels: dict[Head, list[str]], composition: pd.DataFrame, seed: int
) -> dict:
    """The document of one task (module docstring)."""
    clean = decompose(loaded, task)
    heads = head_frame(clean, labels, {})
    receivers = {str(h) for h, names in labels.items() if set(names) & set(RECEIVER_KINDS[task.name])}
    receivers |= set(heads["head"].head(RECEIVERS))
    senders = {str(h) for h, names in labels.items() if set(names) & set(SENDER_KINDS[task.name])}
    edges = receiver_edges(composition, receivers, senders)
    repair = None
    if task.name == "ioi" and clean.metric > 0:
        movers = [h for h, names in labels.items() if "name_mover" in names]
        movers = movers or [Head(int(r.layer), int(r.head_index)) for r in heads.head(MOVERS * 4).itertuples()]
        movers = sorted(movers, key=lambda h: -clean.head(h))[:MOVERS]
        found = self_repair(loaded, task, movers, "zero", seed, clean=clean)
        repair = repair_document(found.meta, found.frame)
    return {
        "task": task_fields(task, clean),
        "method": "zero",
        "large_share": LARGE_SHARE,
        "heads": [
            {
                "head": r.head,
                "labels": list(r.labels),
                "direct_effect": float(r.direct_effect),
                "total_effect": None,
                "large_unlabelled": bool(r.large_unlabelled),
            }
            for r in heads.itertuples()
        ],
        "edges": edges,
        "self_repair": repair,
    }


def receiver_edges(composition: pd.DataFrame, receivers: set[str], senders: set[str]) -> list[dict]:
    """Per receiver, its EDGES_PER_RECEIVER strongest incoming senders by composition z-score (each by its
    strongest input, Q, K or V), the labelled senders first: [{sender, receiver, via, composition,
    composition_z, effect: None}]."""
    into = composition[composition["receiver"].isin(receivers)].astype({"sender": str})
    into = into.sort_values("composition_z", ascending=False, kind="stable").drop_duplicates(["sender", "receiver"])
    into = into.assign(labelled=into["sender"].isin(senders))
    into = into.sort_values(["labelled", "composition_z"], ascending=False, kind="stable")
    kept = into.groupby("receiver", sort=False).head(EDGES_PER_RECEIVER)
    return [
        {
            "sender": r.sender,
            "receiver": r.receiver,
            "via": r.via,
            "composition": float(r.composition),
            "composition_z": float(r.composition_z),
            "effect": None,
        }
        for r in kept.itertuples()
    ]
