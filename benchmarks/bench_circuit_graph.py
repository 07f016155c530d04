"""Circuit discovery on the whole graph of a model: time and memory of each step.

    .venv/bin/python benchmarks/bench_circuit_graph.py smollm2 ioi

Prints, for one task: the graph's size; preparing the reference run; EAP scores for every edge;
EAP-IG (5 steps); the 20-point faithfulness curve with sizes at f 0.8 and 0.9; one exact edge
(exact patching's cost is one such pass per edge, so the whole sweep is that times the edge count;
on graphs of up to EXACT_EDGES edges it runs, and its curve is printed beside EAP's and EAP-IG's);
peak resident memory.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch

from headlens.circuits.discover import Curve, area, log_grid
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.load.models import load_model

EXACT_EDGES = 5_000  # graphs up to this many edges are also scored exactly


def timed(label, fn):
    """Run fn, printing wall time and this process's CPU time (all threads): on a shared machine the
    CPU time over the threads used (torch.get_num_threads()) bounds the wall time on idle cores."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{label}: wall {time.perf_counter() - start:.1f} s, CPU {time.process_time() - cpu:.1f} s", flush=True)
    return out


def main(model: str = "smollm2", task_name: str = "ioi") -> None:
    loaded = load_model(model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    task = circuit_task(loaded, task_name)
    gt = timed("prepare (reference run)", lambda: GraphTask(loaded, task))
    print(f"graph: {gt.graph.n_senders} senders, {gt.graph.n_receivers} receivers, {gt.graph.n_edges} edges")
    print(f"task: {task.description}; tokens {tuple(task.tokens.shape)}")
    eap = timed("EAP, every edge", lambda: gt.scores("eap"))
    ig = timed("EAP-IG 5 steps, every edge", lambda: gt.scores("eap-ig", 5))
    methods = [("eap", eap), ("eap-ig", ig)]
    if gt.graph.n_edges <= EXACT_EDGES:  # exact patching, one pass per edge: small graphs only
        methods.append(("exact", timed("exact, every edge", lambda: gt.scores("exact"))))
    for name, scores in methods:
        curve = Curve(gt, scores)
        grid = log_grid(gt.graph.n_edges, 20)
        fs = timed(f"{name}: 20-point curve", lambda: [curve.circuit(k)[1] for k in grid])  # noqa: B023
        sizes = {t: curve.smallest(t, grid) for t in (0.8, 0.9)}
        print(f"{name}: CPR {area(grid, fs):.3f} CMD {area(grid, [abs(1 - f) for f in fs]):.3f} sizes {sizes}")
        print(f"{name}: curve {[(k, round(f, 3)) for k, f in zip(grid, fs, strict=True)]}")
    one = timed("one exact edge (one patched pass)", lambda: gt.metric(gt.graph.real))
    del one
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
