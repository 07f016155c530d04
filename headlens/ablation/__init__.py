"""Ablation: removing heads on intervene's engine (headlens.intervene: evaluation sets, metrics, replacements,
exact sums, stacked runs, statistics) — one set of heads at once (`ablate_heads`) or every head alone (the
sweep, `sweep_heads`), heads by role, gradient estimates (attribution patching, AtP*, GradDrop, head
importance), pruning curves and the resumable sweep store.

Public names are re-exported here. The exact ablation's are imported with the package; the gradient
estimates' and pruning's (approx, prune and the gradients they read) when first asked for, through the
module's `__getattr__` (headlens.lazy.lazy_getattr, PEP 562), so an exact ablation loads no gradient code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.lazy import lazy_exports, lazy_getattr

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.ablation.approx import agreement, approx_sweep
    from headlens.ablation.prune import prune_curve, removal_by_role

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)


__all__ = sorted(["ablate_heads", "sweep_heads", *LAZY])
