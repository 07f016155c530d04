"""A model's classification under the default probes, computed once and kept in headlens's cache; or
read back from what `headlens classify` wrote (heads.json / heads.csv, or its `--format json|csv` output).

The entry (headlens.cache, kind "classify") holds the classify frame's records (headlens.classify.head_records)
as JSON. Its key hashes the weights as they are in memory (loaded.digest(): a model edited after loading
classifies again), the default ClassifyConfig and headlens's release: new weights, other defaults or another
release classify again. An entry that does not read back as records is computed again.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from headlens import __version__, cache
from headlens.bounds import shown
from headlens.classify.frame import classify_heads, head_records
from headlens.classify.labels import ClassifyConfig, label_list
from headlens.errors import InputTextError
from headlens.files import parse_json, read_capped
from headlens.load.models import LoadedModel

KIND = "classify"


def classification_key(loaded: LoadedModel) -> str:
    """The cache key of the model's default classification: its weights as they are in memory
    (loaded.digest()), the default ClassifyConfig and headlens's release."""
    return cache.key(KIND, loaded.digest(), config=asdict(ClassifyConfig()), release=__version__)


def cached_classification(loaded: LoadedModel, progress: bool = False) -> pd.DataFrame:
    """The classify frame (classify_heads' `.frame`, without its meta: the explorer reads the labels and
    scores) of `loaded` under the default probes: from the cache, else classified now and cached."""
    entry_key = classification_key(loaded)
    data = cache.get(KIND, entry_key)
    try:
        return records_frame(json.loads(data))
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError):  # absent (None) or damaged: again
        pass
    frame = classify_heads(loaded, progress=progress).frame
    cache.put(KIND, entry_key, json.dumps(head_records(frame)).encode(), model=loaded.display_name)
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
