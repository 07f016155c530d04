"""Ablation: evaluation sets (text, prompts, repeats, needles), metrics, replacements (zero /
mean / resample), the exact layer-by-layer sweep, heads by role with random controls,
attribution patching and AtP*, pruning curves and the resumable sweep store. Public names are
re-exported here."""

from headlens.ablation.ablate import ablate_heads, ablation_hooks, sweep_heads
from headlens.ablation.approx import agreement, approx_sweep
from headlens.ablation.prune import prune_curve, removal_by_role

__all__ = ["ablate_heads", "ablation_hooks", "agreement", "approx_sweep", "prune_curve", "removal_by_role",
           "sweep_heads"]
