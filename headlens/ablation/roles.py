"""Heads chosen by role, and random head sets as a control.

A role (any label of the registry of head kinds, headlens.kinds: `induction`, `retrieval`,
`successor`, ..., also written `label:NAME`) resolves to the heads carrying that label,
read from a `heads.json` written by `headlens classify --out` or found by classifying the model
(headlens.classify.classify_heads, default probes).

The control (Wu et al. 2024: knocking out retrieval heads breaks needle retrieval, knocking out
as many random heads barely changes it) draws K random head sets with the chosen set's per-layer
counts, seeded, and places the chosen set's change among theirs: `rank` (1 = the largest
absolute change of the K + 1 sets) and the empirical p-value (1 + #{|control| >= |chosen|}) /
(K + 1) (Phipson & Smyth 2010).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headlens.classify import classify_heads
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head, parse_heads
from headlens.labels import LABELS

ROLES = LABELS  # every kind of the registry (headlens.kinds) is a role spec: `--heads successor`


def role_name(spec: str) -> str | None:
    """The label a head spec asks for (`induction`, `label:NAME`), or None for explicit heads."""
    spec = str(spec).strip()
    if spec.startswith("label:"):
        name = spec[len("label:"):].strip()
        if name not in LABELS:
            raise ConfigError(f"unknown label {name!r} in {spec!r}: choose one of {', '.join(LABELS)}")
        return name
    return spec if spec in ROLES else None


def read_labels(path) -> dict[Head, list[str]]:
    """Head -> labels from a heads.json written by `headlens classify --out`."""
    path = Path(path)
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        return {Head(int(r["layer"]), int(r["head"])): list(r.get("labels") or []) for r in records}
    except FileNotFoundError:
        raise InputTextError(f"labels file not found: {path}") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        raise InputTextError(f"{path} is not a heads.json written by `headlens classify --out` "
                             "(a list of objects with layer, head, labels)") from None


def model_labels(loaded, labels: dict[Head, list[str]] | None = None) -> dict[Head, list[str]]:
    """`labels` checked against the model's shape, or the labels of classifying the model."""
    spec = loaded.spec
    if labels is None:
        frame = classify_heads(loaded)
        return {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}
    outside = [h for h in labels if h.layer >= spec.n_layers or h.head >= spec.n_heads]
    if outside or len(labels) != spec.n_layers * spec.n_heads:
        raise ConfigError(f"the labels file describes another model ({len(labels)} heads) than this one "
                          f"({spec.n_layers} layers x {spec.n_heads} heads)")
    return labels


def resolve_heads(loaded, spec, labels: dict[Head, list[str]] | None = None) -> tuple[list[Head], str | None]:
    """Heads of a spec ("3.4,5.1", "layer:3", "all", a role, `label:NAME`, or a list of heads)
    and, for a role, how they were chosen (in words). ConfigError when no head has the role."""
    shape = loaded.spec
    if not isinstance(spec, str):
        return sorted(Head(*h) for h in spec), None
    role = role_name(spec)
    if role is None:
        return parse_heads(spec, shape.n_layers, shape.n_heads), None
    source = "the labels file" if labels is not None else "classifying the model (default probes)"
    found = model_labels(loaded, labels)
    heads = sorted(h for h, names in found.items() if role in names)
    if not heads:
        raise ConfigError(f"no head of this model is labelled {role} by {source}")
    return heads, f"heads labelled {role} by {source}"


def control_sets(heads: list[Head], n_heads: int, k: int, seed: int) -> list[list[Head]]:
    """K random head sets with the same number of heads in each layer as `heads`, seeded."""
    gen = torch.Generator().manual_seed(seed)
    counts = {}
    for head in heads:
        counts[head.layer] = counts.get(head.layer, 0) + 1
    sets = []
    for _ in range(k):
        picked = [Head(layer, int(h)) for layer, c in sorted(counts.items())
                  for h in torch.randperm(n_heads, generator=gen)[:c]]
        sets.append(sorted(picked))
    return sets


def parse_control(spec: str | None) -> int:
    """K of `random:K` (0 for None); ConfigError otherwise."""
    if spec is None:
        return 0
    kind, _, value = str(spec).partition(":")
    if kind.strip() != "random" or not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"control {spec!r} is not understood: give random:K with K >= 1 (e.g. random:20)")
    return int(value)


def control_summary(chosen: float, deltas: list[float], sets: list[list[Head]], seed: int) -> dict:
    """Where the chosen set's change falls among the control sets' changes."""
    larger = sum(abs(d) > abs(chosen) for d in deltas)
    at_least = sum(abs(d) >= abs(chosen) for d in deltas)
    return {"k": len(deltas), "seed": seed, "sets": [[str(h) for h in s] for s in sets], "deltas": deltas,
            "rank": 1 + larger, "p_value": (1 + at_least) / (1 + len(deltas))}
