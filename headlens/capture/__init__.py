"""Capture: stream every head's pattern and z into reducers, on Hugging Face models (eager or
lean path) and on a TransformerLens bridge. Public names are re-exported here."""

from headlens.capture.bridge import is_bridge, n_heads_of, n_layers_of
from headlens.capture.reducers import (
    Batch,
    CollectPatterns,
    Reducer,
    check_atol,
    check_pattern,
    iter_batches,
    pad_batch,
)
from headlens.capture.run import attention_implementation, attention_pattern, capture_hooks, forward, run_capture

__all__ = [
    "Batch",
    "CollectPatterns",
    "Reducer",
    "attention_implementation",
    "attention_pattern",
    "capture_hooks",
    "check_atol",
    "check_pattern",
    "forward",
    "is_bridge",
    "iter_batches",
    "n_heads_of",
    "n_layers_of",
    "pad_batch",
    "run_capture",
]
