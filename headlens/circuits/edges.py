"""The edge frame every circuit result shares, and the edges a model has.

An edge runs from a sender head's output to a later receiver head's query, key or value input
through the residual stream, or from the sender straight to the logits (`via` "direct"), as in
ACDC and edge attribution patching (Conmy et al. 2023; Syed et al. 2023). Columns:
`sender` ("L.H"), `receiver` ("L.H" or "logits"), `via` ("q", "k", "v", "direct"), then
`composition`, `effect` and `attribution`, NaN where that measurement was not made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from headlens.heads import Head

VIAS = ("q", "k", "v")  # a receiver head's inputs
DIRECT = "direct"  # the sender's output read by the unembedding
LOGITS = "logits"  # the receiver of a direct edge
KEY = ["sender", "receiver", "via"]
MEASURES = ["composition", "effect", "attribution"]
EDGE_COLUMNS = KEY + MEASURES


def edge_frame(senders: Sequence[Head], receivers: Sequence[str], vias: Sequence[str], **measures: Any) -> pd.DataFrame:
    """A frame of edges (one row per position of the three sequences) with the measures given and
    NaN for the rest; extra keyword columns are kept after the edge columns."""
    frame = pd.DataFrame({"sender": [str(s) for s in senders], "receiver": list(receivers), "via": list(vias)})
    for name in MEASURES:
        frame[name] = np.asarray(measures.pop(name), dtype=float) if name in measures else np.nan
    for name, values in measures.items():
        frame[name] = values
    return frame


def later_pairs(heads: Sequence[Head], receivers: Sequence[Head]) -> list[tuple[Head, Head]]:
    """(sender, receiver) pairs with the sender in an earlier layer, receiver-major."""
    return [(s, r) for r in receivers for s in heads if s.layer < r.layer]


def merge_edges(*frames: pd.DataFrame) -> pd.DataFrame:
    """Edge frames joined on (sender, receiver, via): each measure taken from the frame that has it."""
    out = None
    for frame in frames:
        if out is None:
            out = frame.copy()
            continue
        keep = [c for c in frame.columns if c not in KEY and frame[c].notna().any()]
        out = out.drop(columns=[c for c in keep if c in out.columns and c not in MEASURES], errors="ignore")
        joined = out.merge(frame[KEY + keep], on=KEY, how="outer", suffixes=("", "_new"))
        for column in keep:
            if column + "_new" in joined:
                joined[column] = joined[column + "_new"].combine_first(joined[column])
                joined = joined.drop(columns=column + "_new")
        out = joined
    return out
