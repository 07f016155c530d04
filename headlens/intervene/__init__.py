"""Interventions on a model's heads, the engine under ablation/ and circuits/: evaluation sets and their specs
(text, prompts, repeats, needles), the task metrics, what a head's output z becomes (zero, mean, resample, or
patched from another run) and the hooks that put it there, the exact sums of runs with heads replaced (heads
together, every head alone layer by layer, stacked as batch copies), the clean-run cache, and the statistics
of interventions (units, bootstrap intervals, random controls).

Its modules are imported by name (headlens.intervene.replace, .evalset, .evalspec, .metrics, .sums, .stacked,
.clean, .stats); the stage re-exports nothing.
"""
