"""Capture: stream every head's pattern and z into reducers, on Hugging Face models (eager or
lean path) and on a TransformerLens bridge.

Public names are re-exported here. The reducers' (batches, padding, pattern checks) are imported with the
package; the capture run's and the bridge's when first asked for, through the module's `__getattr__`
(headlens.lazy.lazy_getattr, PEP 562), so a stage that only pads batches (the ablation's evaluation sets)
loads no capture hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.capture.reducers import (
    Batch,
    CollectPatterns,
    Reducer,
    check_atol,
    check_pattern,
    iter_batches,
    pad_batch,
)
from headlens.lazy import lazy_getattr

if TYPE_CHECKING:  # the names LAZY imports, for type checkers
    from headlens.capture.bridge import is_bridge, n_heads_of, n_layers_of
    from headlens.capture.run import attention_pattern, capture_hooks, forward, run_capture

# Public name -> the module of headlens.capture that defines it, imported on first access.
LAZY = {
    "attention_pattern": "run",
    "capture_hooks": "run",
    "forward": "run",
    "is_bridge": "bridge",
    "n_heads_of": "bridge",
    "n_layers_of": "bridge",
    "run_capture": "run",
}

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)


__all__ = [
    "Batch",
    "CollectPatterns",
    "Reducer",
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
