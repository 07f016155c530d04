"""A model's classification under the default probes, computed once and kept in headlens's cache; or
read back from what `headlens classify` wrote (heads.json / heads.csv, or its `--format json|csv` output).

The cache entry is `<cache root>/classify/<key>.json` (headlens.load.cache.cache_root), the classify frame's
records (headlens.classify.head_records). The key is the sha256 of the model's weights (a GGUF's own
sha256, else every parameter's name, shape, dtype and bytes), the default ClassifyConfig, headlens's
version and SCORES_VERSION: new weights, other defaults or another release classify again. Written atomically
(headlens.files.write_atomic); an unreadable entry is computed again.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from headlens import __version__
from headlens.bounds import shown
from headlens.classify.frame import classify_heads, head_records
from headlens.classify.labels import ClassifyConfig, label_list
from headlens.errors import InputTextError
from headlens.files import parse_json, read_capped, write_atomic
from headlens.load.cache import cache_root


def weights_digest(loaded) -> str:
    """sha256 identifying the model's weights: the GGUF's sha256 when it was dequantized from one, else a
    digest of every parameter and buffer (name, shape, dtype, bytes)."""
    if loaded.source is not None:
        return f"gguf:{loaded.source.sha256}"
    digest = hashlib.sha256()
    for name, tensor in loaded.model.state_dict().items():
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        data = tensor.detach().contiguous().cpu()
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


# Raised whenever a probe or score computes something else for the same weights and config (the
# copy-suppression OV criterion over the vocabulary is 2, its QK criterion 3), so that no cached
# classification outlives it.
SCORES_VERSION = 3


def classification_key(loaded) -> str:
    """The cache key of the model's default classification."""
    facts = {
        "weights": weights_digest(loaded),
        "config": asdict(ClassifyConfig()),
        "version": __version__,
        "scores": SCORES_VERSION,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cached_classification(loaded, progress: bool = False) -> pd.DataFrame:
    """The classify frame (classify_heads' `.frame`, without its meta: the explorer reads the labels and
    scores) of `loaded` under the default probes: from the cache, else classified now and cached."""
    path = cache_root() / "classify" / f"{classification_key(loaded)}.json"
    try:
        return records_frame(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    frame = classify_heads(loaded, progress=progress).frame
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(head_records(frame)))
    return frame


def records_frame(records) -> pd.DataFrame:
    """A classify frame from its records (a list of objects with layer, head, labels and scores)."""
    frame = pd.DataFrame(list(records))
    frame["layer"] = frame["layer"].astype(int)
    frame["head"] = frame["head"].astype(int)
    frame["labels"] = [label_list(value) for value in frame.get("labels", [None] * len(frame))]
    return frame.sort_values(["layer", "head"], ignore_index=True)


def read_classification(path) -> pd.DataFrame:
    """A classify frame from a file `headlens classify` wrote: JSON records or CSV (labels "a;b").
    InputTextError when the file is missing, not a regular file, too large (headlens.files.read_capped), or is
    neither."""
    path = Path(path)
    raw = read_capped(path, "--labels", InputTextError)  # a regular file under a cap: never a FIFO or /dev/zero
    try:
        if path.suffix.lower() == ".csv":
            return records_frame(pd.read_csv(io.BytesIO(raw)).to_dict("records"))
        data = parse_json(raw, f"--labels {shown(str(path))}", InputTextError)
        return records_frame(data["heads"] if isinstance(data, dict) and "heads" in data else data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, pd.errors.ParserError):
        raise InputTextError(
            f"{path} is not a classification written by `headlens classify` "
            "(heads.json / heads.csv: one record per head with layer, head, labels)"
        ) from None
