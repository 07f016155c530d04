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
from headlens.lazy import lazy_exports, lazy_getattr

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.capture.bridge import is_bridge, n_heads_of, n_layers_of
    from headlens.capture.run import attention_pattern, capture_hooks, forward, run_capture

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)


__all__ = sorted(
    ["Batch", "CollectPatterns", "Reducer", "check_atol", "check_pattern", "iter_batches", "pad_batch", *LAZY]
)
