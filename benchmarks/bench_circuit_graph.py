"""Circuit discovery on the whole graph of a model: time and memory of each step.

    .venv/bin/python benchmarks/bench_circuit_graph.py smollm2 ioi [THREADS [CURVES]]

THREADS (default 0: torch's default) sets torch's thread count: with 1 thread the CPU time is what
one idle core takes, whatever else the machine runs (two threads on a loaded machine spin and wait).
CURVES "eap" (default) times EAP's curve alone, without the sizes at f 0.8 and 0.9; "all" every curve
with its sizes.

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


def main(model: str = "smollm2", task_name: str = "ioi", threads: str = "0", curves: str = "eap") -> None:
    if int(threads):  # on a loaded machine one thread's CPU time is the work an idle core does
        torch.set_num_threads(int(threads))
    loaded = load_model(model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    task = circuit_task(loaded, task_name)
    gt = timed("prepare (reference run)", lambda: GraphTask(loaded, task))
    print(f"graph: {gt.graph.n_senders} senders, {gt.graph.n_receivers} receivers, {gt.graph.n_edges} edges")
    print(f"task: {task.description}; tokens {tuple(task.tokens.shape)}")
    timed("ends: m(M) (the plain pass) and m(empty) (the reference run)", gt.ends)
    eap = timed("EAP, every edge", lambda: gt.scores("eap"))
    ig = timed("EAP-IG 5 steps, every edge", lambda: gt.scores("eap-ig", 5))
    methods = [("eap", eap), ("eap-ig", ig)]
    if gt.graph.n_edges <= EXACT_EDGES:  # exact patching, one pass per edge: small graphs only
        methods.append(("exact", timed("exact, every edge", lambda: gt.scores("exact"))))
    for name, scores in methods if curves == "all" else methods[:1]:
        curve = Curve(gt, scores)
        grid = log_grid(gt.graph.n_edges, 20)
        fs = timed(f"{name}: 20-point curve", lambda: [curve.circuit(k)[1] for k in grid])  # noqa: B023
        sizes = {t: curve.smallest(t, grid) for t in (0.8, 0.9)} if curves == "all" else {}
        print(f"{name}: CPR {area(grid, fs):.3f} CMD {area(grid, [abs(1 - f) for f in fs]):.3f} sizes {sizes}")
        print(f"{name}: curve {[(k, round(f, 3)) for k, f in zip(grid, fs, strict=True)]}")
    one = gt.graph.real.clone()
    one[0, gt.graph.logits_receiver] = False  # the whole graph less one edge: one exact edge's pass
    timed(f"one exact edge (one patched pass; x {gt.graph.n_edges} edges for the sweep)", lambda: gt.metric(one))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
