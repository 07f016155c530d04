"""Heads: `Head(layer, head)`, 0-indexed, written "L.H" (TransformerLens `LxHy`)."""

from __future__ import annotations

import re
from typing import NamedTuple

from headlens.bounds import shown
from headlens.errors import InvalidHeadError

# ASCII digits only: `\d` and str.isdigit take other scripts' digits (`٣`), and int() rejects some (`²`)
_HEAD_RE = re.compile(r"\s*([0-9]{1,30})\s*\.\s*([0-9]{1,30})\s*")
_LAYER_RE = re.compile(r"\s*layer\s*:\s*([0-9]{1,30})\s*")


class Head(NamedTuple):
    """One attention head: `layer` and `head`, both 0-indexed."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"


def all_heads(n_layers: int, n_heads: int) -> list[Head]:
    """Every head of a model, in (layer, head) order."""
    return [Head(layer, head) for layer in range(n_layers) for head in range(n_heads)]


def _range_message(n_layers: int, n_heads: int) -> str:
    return f"this model has {n_layers} layers x {n_heads} heads (layers 0-{n_layers - 1}, heads 0-{n_heads - 1})"


def check_heads(heads, n_layers: int, n_heads: int) -> list[Head]:
    """`heads` (pairs of integers) as a list of Head, or InvalidHeadError for one outside the model: a negative
    index never picks a head counted from the end, a layer past the last is never read."""
    checked = []
    for pair in heads:
        layer, head = pair
        if not all(type(i) is int and i >= 0 for i in (layer, head)) or layer >= n_layers or head >= n_heads:
            raise InvalidHeadError(
                f"head {shown(layer, 30)}.{shown(head, 30)} is out of range: {_range_message(n_layers, n_heads)}"
            )
        checked.append(Head(layer, head))
    return checked


def parse_heads(spec: str, n_layers: int, n_heads: int) -> list[Head]:
    """Parse "3.4,5.1", "layer:3" or "all" into a sorted list of distinct heads.

    Raises InvalidHeadError naming the offending piece and the model's range for malformed
    specs, out-of-range heads, duplicates and empty specs.
    """
    if spec is None or not str(spec).strip():
        raise InvalidHeadError("empty head spec: give heads as L.H,L.H (e.g. 3.4,5.1), layer:L or all")
    spec = str(spec).strip()
    quoted = shown(spec)
    if spec.lower() == "all":
        return all_heads(n_layers, n_heads)
    heads: list[Head] = []
    for piece in spec.split(","):
        if not piece.strip():
            raise InvalidHeadError(f"empty entry in head spec {quoted}: give heads as L.H,L.H (e.g. 3.4,5.1)")
        layer_match = _LAYER_RE.fullmatch(piece)
        if layer_match:
            layer = int(layer_match.group(1))
            if layer >= n_layers:
                raise InvalidHeadError(f"layer {layer} is out of range: {_range_message(n_layers, n_heads)}")
            heads.extend(Head(layer, h) for h in range(n_heads))
            continue
        match = _HEAD_RE.fullmatch(piece)
        if not match:
            raise InvalidHeadError(
                f"malformed head {shown(piece.strip(), 40)} in {quoted}: expected L.H with integers (e.g. 3.4), "
                "layer:L or all"
            )
        head = Head(int(match.group(1)), int(match.group(2)))
        if head.layer >= n_layers or head.head >= n_heads:
            raise InvalidHeadError(f"head {head} is out of range: {_range_message(n_layers, n_heads)}")
        heads.append(head)
    seen: set[Head] = set()
    for head in heads:
        if head in seen:
            raise InvalidHeadError(f"head {head} appears more than once in {quoted}")
        seen.add(head)
    return sorted(heads)


def format_heads(heads: list[Head]) -> str:
    """The inverse of parse_heads for explicit lists: "3.4,5.1"."""
    return ",".join(str(h) for h in heads)
