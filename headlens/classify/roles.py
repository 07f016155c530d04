"""Which heads an ablation or a circuit takes: explicit heads, every head at once, or the heads of a role.

A spec is "3.4,5.1", "layer:3", `all` (every head, ablated together) or a role (any label
of the registry of head kinds, headlens.classify.kinds: `induction`, `retrieval`, `successor`, ..., also
written `label:NAME`); `each` (every head alone) is the single-head sweep's, `sweep_heads`.
A role resolves to the heads carrying that label, read from a `heads.json` written by
`headlens classify --out` or found by classifying the model (headlens.classify.classify_heads,
default probes; the classifier is imported only then). It sits in classify/ because both ablation/ and
circuits/ read it, and neither may import the other (tests/test_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.bounds import shown
from headlens.classify.kinds import LABELS
from headlens.errors import ConfigError, InputTextError
from headlens.files import read_json
from headlens.heads import Head, check_heads, parse_heads

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

MAX_LABELS_BYTES = 64 << 20  # a heads.json: every head of the largest model headlens opens, with room to spare

ROLES = LABELS  # every kind of the registry (headlens.classify.kinds) is a role spec: `--heads successor`
EACH = "each"  # every head alone: the sweep's spec, not a set


def role_name(spec: str) -> str | None:
    """The label a head spec asks for (`induction`, `label:NAME`), or None for explicit heads."""
    spec = str(spec).strip()
    if spec.startswith("label:"):
        name = spec[len("label:") :].strip()
        if name not in LABELS:
            raise ConfigError(f"unknown label {shown(name, 40)} in {shown(spec)}: choose one of {', '.join(LABELS)}")
        return name
    return spec if spec in ROLES else None


def read_labels(path) -> dict[Head, list[str]]:
    """Head -> labels from a heads.json written by `headlens classify --out`: a regular file under
    MAX_LABELS_BYTES (headlens.files.read_json), read by schema (a list of objects, each with a layer and a head
    that are integers >= 0 and labels that are a list of strings), else InputTextError."""
    records = read_json(path, "--labels", InputTextError, MAX_LABELS_BYTES)
    labels = {}
    for record in records if isinstance(records, list) else [None]:
        if not _label_record(record):
            raise InputTextError(
                "--labels file is not a heads.json written by `headlens classify --out` "
                "(a list of objects with layer and head, integers >= 0, and labels, a list of names)"
            )
        labels[Head(record["layer"], record["head"])] = list(record.get("labels") or [])
    return labels


def _label_record(record) -> bool:
    if not isinstance(record, dict):
        return False
    indices = all(type(record.get(key)) is int and record[key] >= 0 for key in ("layer", "head"))
    names = record.get("labels") or []
    return indices and isinstance(names, list) and all(isinstance(name, str) for name in names)


def frame_labels(frame) -> dict[Head, list[str]]:
    """Head -> labels of a classify frame."""
    return {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}


def classified(loaded: LoadedModel):
    """The classification (a classify_heads Result) of the model under the default probes."""
    from headlens.classify import classify_heads  # the whole probe stack, needed only here

    return classify_heads(loaded)


def why_absent(heads, role: str) -> str | None:
    """In words, the head of a classification (a classify_heads Result) highest on the ranking score of a role
    no head carries."""
    from headlens.classify.labels import absent_roles  # the labelling rules, needed only with a classification

    return next((a.describe() for a in absent_roles(heads.frame, heads.meta) if a.label == role), None)


def model_labels(loaded: LoadedModel, labels: dict[Head, list[str]] | None = None) -> dict[Head, list[str]]:
    """`labels` checked against the model's shape, or the labels of classifying the model."""
    spec = loaded.spec
    if labels is None:
        return frame_labels(classified(loaded).frame)
    outside = [h for h in labels if not (0 <= h.layer < spec.n_layers and 0 <= h.head < spec.n_heads)]
    if outside or len(labels) != spec.n_layers * spec.n_heads:
        raise ConfigError(
            f"the labels file describes another model ({len(labels)} heads) than this one "
            f"({spec.n_layers} layers x {spec.n_heads} heads)"
        )
    return labels


def resolve_heads(
    loaded: LoadedModel, spec, labels: dict[Head, list[str]] | None = None
) -> tuple[list[Head], str | None]:
    """Heads of a spec ("3.4,5.1", "layer:3", "all", a role, `label:NAME`, or a list of heads)
    and, for a role, how they were chosen (in words). ConfigError when no head has the role (naming,
    when this call classified the model, the head highest on the kind's ranking score: labels.Absence),
    and for `each` (one head at a time is a sweep: sweep_heads)."""
    shape = loaded.spec
    if not isinstance(spec, str):
        return sorted(check_heads(spec, shape.n_layers, shape.n_heads)), None
    if spec.strip().lower() == EACH:
        raise ConfigError(
            "heads 'each' means every head alone, one at a time: that is sweep_heads "
            "(`headlens ablate --heads each`); 'all' ablates every head together"
        )
    role = role_name(spec)
    if role is None:
        return parse_heads(spec, shape.n_layers, shape.n_heads), None
    source = "the labels file" if labels is not None else "classifying the model (default probes)"
    classification = classified(loaded) if labels is None else None  # kept to say why a role is absent
    found = model_labels(loaded, labels) if classification is None else frame_labels(classification.frame)
    heads = sorted(h for h, names in found.items() if role in names)
    if not heads:
        why = why_absent(classification, role) if classification is not None else None
        raise ConfigError(f"no head of this model is labelled {role} by {source}" + (f"; {why}" if why else ""))
    return heads, f"heads labelled {role} by {source}"
