"""EAP's and EAP-IG's circuits against exact patching's, size for size, chosen top-n or greedily.

    .venv/bin/python benchmarks/circuit_eap_vs_exact.py tiny induction:4:12 ioi

Each task (`induction:N:LEN`: N sequences of LEN random tokens repeated; `ioi`, `greater-than`: the
circuit tasks' defaults): every edge of the model's whole graph scored three ways (exact patching, one pass
per edge; EAP; EAP-IG 5 steps); then at each size k of a 12-point log grid, each method's k-edge circuit,
chosen as the k largest |score| ("top", EAP-IG's `apply_topn`) and grown from the logits ("greedy",
`apply_greedy`), pruned, and measured by MIB's faithfulness (counterfactual patching outside it). Prints
the curves, for EAP and EAP-IG the largest and mean |f(method's circuit) - f(exact's circuit)| over the
grid (same selection; the issue's aim: at most 0.05), and the smallest k reaching f >= 0.8 of each. Last,
EAP refined by exact patching: EAP's top m edges (m = SHORTLISTS) ranked by their exact scores ahead of the
rest (ranked by EAP), the cost m exact passes; its smallest k reaching 0.8 and its gap to exact's circuits.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from headlens.circuits.discover import Curve, log_grid
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.circuits.tasks import induction_task
from headlens.load.models import load_model

POINTS = 12
METHODS = ("exact", "eap", "eap-ig")
SELECTIONS = ("top", "greedy")
SHORTLISTS = (8, 16, 32, 64)


def make(loaded, spec: str):
    name, *sizes = spec.split(":")
    if name == "induction" and sizes:
        return induction_task(loaded, n=int(sizes[0]), seq_len=int(sizes[1]), seed=0)
    return circuit_task(loaded, name)


def compare(loaded, spec: str) -> None:
    gt = GraphTask(loaded, make(loaded, spec))
    grid = log_grid(gt.graph.n_edges, POINTS)
    curves, smallest, all_scores = {}, {}, {}
    for method in METHODS:
        start = time.perf_counter()
        scores = all_scores[method] = gt.scores(method, 5)
        for selection in SELECTIONS:
            curve = Curve(gt, scores, selection)
            curves[method, selection] = [curve.circuit(k)[1] for k in grid]
            smallest[method, selection] = curve.smallest(0.8, grid)
        print(f"{spec} {method}: scores and curves in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"{spec}: {gt.graph.n_edges} edges, m(model) {curve.full:.4f}, m(empty) {curve.empty:.4f}")
    keys = [(m, s) for s in SELECTIONS for m in METHODS]
    print("  k       " + "  ".join(f"{m}/{s}" for m, s in keys))
    for i, k in enumerate(grid):
        print(f"  {k:6d}  " + "  ".join(f"{curves[key][i]:+.3f}" for key in keys))
    for selection in SELECTIONS:
        for method in METHODS[1:]:
            gap = np.abs(np.asarray(curves[method, selection]) - np.asarray(curves["exact", selection]))
            worst = grid[int(gap.argmax())]
            print(
                f"{spec} {method} vs exact ({selection}): max |gap| {gap.max():.3f} at k {worst}, mean {gap.mean():.3f}"
            )
    for key in keys:
        print(f"{spec} smallest k with f >= 0.8, {key[0]} {key[1]}: {smallest[key]}")
    refine(gt, grid, all_scores, curves["exact", "top"], spec)


def refine(gt, grid, scores, exact_curve, spec: str) -> None:
    """EAP's top m edges re-ranked by exact patching, ahead of the rest (module docstring)."""
    eap, exact = scores["eap"], scores["exact"]
    order = eap.abs().masked_fill(~gt.graph.real, -1.0).flatten().argsort(descending=True)
    top = eap.abs().max() + exact.abs().max() + 1.0
    for m in SHORTLISTS:
        short = torch.zeros(eap.numel(), dtype=torch.bool)
        short[order[:m]] = True
        short = short.view(eap.shape)
        ranked = torch.where(short, top + exact.abs(), eap.abs())  # the shortlist first, by |exact|
        curve = Curve(gt, ranked)
        fs = [curve.circuit(k)[1] for k in grid]
        gap = np.abs(np.asarray(fs) - np.asarray(exact_curve))
        print(
            f"{spec} EAP top {m} refined by exact ({m} passes): smallest k with f >= 0.8 "
            f"{curve.smallest(0.8, grid)}; max |gap| to exact {gap.max():.3f}, mean {gap.mean():.3f}"
        )


def main(model: str = "tiny", *tasks: str) -> None:
    loaded = load_model(model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    for spec in tasks or ("induction:4:12",):
        compare(loaded, spec)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
