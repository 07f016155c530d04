"""Ablation: evaluation sets (text, prompts, repeats, needles) and their metrics, what z becomes
(zero / mean / resample) and the hooks that put it there, the exact sums (heads together, every head
alone layer by layer), their statistics (bootstrap, random controls), heads by role, gradient
estimates (attribution patching, AtP*, GradDrop, head importance), pruning curves and the resumable
sweep store. Public names are re-exported here."""

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.ablation.approx import agreement, approx_sweep
from headlens.ablation.prune import prune_curve, removal_by_role
from headlens.ablation.replace import ablation_hooks

__all__ = [
    "ablate_heads",
    "ablation_hooks",
    "agreement",
    "approx_sweep",
    "prune_curve",
    "removal_by_role",
    "sweep_heads",
]
