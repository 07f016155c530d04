"""Ablation: evaluation sets, replacements (zero / mean / resample), the exact layer-by-layer
sweep, attribution patching, pruning curves and the resumable sweep store. Public names are
re-exported here."""

from headlens.ablation.ablate import ablate_heads, ablation_hooks, agreement, approx_sweep, sweep_heads
from headlens.ablation.prune import prune_curve

__all__ = ["ablate_heads", "ablation_hooks", "agreement", "approx_sweep", "prune_curve", "sweep_heads"]
