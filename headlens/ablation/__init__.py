"""Ablation: evaluation sets (text, prompts, repeats, needles) and their metrics, what z becomes
(zero / mean / resample) and the hooks that put it there, the exact sums (heads together, every head
alone layer by layer), their statistics (bootstrap, random controls), heads by role, gradient
estimates (attribution patching, AtP*, GradDrop, head importance), pruning curves and the resumable
sweep store.

Public names are re-exported here. The exact ablation's are imported with the package; the gradient
estimates' and pruning's (approx, prune and the gradients they read) when first asked for, through the
module's `__getattr__` (PEP 562, as `from headlens.ablation import prune_curve` does), so an exact
ablation loads no gradient code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.ablation.replace import ablation_hooks

if TYPE_CHECKING:  # the names LAZY imports, for type checkers
    from headlens.ablation.approx import agreement, approx_sweep
    from headlens.ablation.prune import prune_curve, removal_by_role

# Public name -> the module of headlens.ablation that defines it, imported on first access.
LAZY = {"agreement": "approx", "approx_sweep": "approx", "prune_curve": "prune", "removal_by_role": "prune"}


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
    globals()[name] = value  # later lookups find it without this hook
    return value


__all__ = [
    "ablate_heads",
    "ablation_hooks",
    "agreement",
    "approx_sweep",
    "prune_curve",
    "removal_by_role",
    "sweep_heads",
]
