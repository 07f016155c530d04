"""Circuits: how heads work together. Tasks (induction, IOI) and their metrics, each head's direct effect
through the logits and the compensation when heads are ablated (self-repair), composition scores from the
weights, path patching and edge attribution.

Public names are imported when first asked for (headlens.lazy_getattr, PEP 562).
"""

from __future__ import annotations

from headlens import lazy_getattr

# Public name -> the module of headlens.circuits that defines it, imported on first access.
LAZY = {
    "Task": "tasks",
    "induction_task": "tasks",
    "ioi_task": "tasks",
    "make_task": "tasks",
}

__getattr__ = lazy_getattr(__name__, LAZY)

__all__ = sorted(LAZY)
