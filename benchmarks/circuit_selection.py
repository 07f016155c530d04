"""How many edges a circuit needs for faithfulness 0.8: top-n by |score| against greedy selection.

    .venv/bin/python benchmarks/circuit_selection.py smollm2 ioi eap

Scores every edge of the model's graph once (exact, eap or eap-ig 5 steps), then measures the circuit of
each size in MIB's grid (0.1%, 0.2%, 0.5%, 1%, 2%, 5%, 10%, 20% of the edges; MIB-circuit-track
evaluate_area_under_curve) chosen two ways: the n largest |score| (EAP-IG's `apply_topn`) and grown from
the logits (`apply_greedy`), each pruned to the nodes on a path from the input to the logits. Prints f
and the pruned size of each, then the smallest grid size reaching f >= 0.8 for each selection.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from headlens.circuits.discover import Curve
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.load.models import load_model

SHARES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
TARGET = 0.8


def main(model: str = "smollm2", task_name: str = "ioi", method: str = "eap") -> None:
    loaded = load_model(model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    gt = GraphTask(loaded, circuit_task(loaded, task_name))
    start = time.perf_counter()
    scores = gt.scores(method, 5)
    print(f"{model} {task_name}: {gt.graph.n_edges} edges, {method} scores in {time.perf_counter() - start:.0f} s")
    found = {}
    for selection in ("top", "greedy"):
        curve = Curve(gt, scores, selection)
        print(f"{selection}: m(model) {curve.full:.4f}, m(empty) {curve.empty:.4f}", flush=True)
        for share in SHARES:
            k = max(1, int(share * gt.graph.n_edges))
            keep, f = curve.circuit(k)
            print(f"  {selection} {share:.1%}: k {k}, pruned {int(keep.sum())} edges, f {f:.3f}", flush=True)
            if f >= TARGET and selection not in found:
                found[selection] = (share, k, int(keep.sum()))
    for selection in ("top", "greedy"):
        print(f"smallest grid size with f >= {TARGET} by {selection}: {found.get(selection, 'none up to 20%')}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
