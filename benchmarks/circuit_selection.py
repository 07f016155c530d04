"""How many edges a circuit needs for faithfulness 0.8 and 0.9, top-n by |score| against greedy selection.

    .venv/bin/python benchmarks/circuit_selection.py smollm2 ioi eap
    .venv/bin/python benchmarks/circuit_selection.py smollm2 ioi eap-ig --steps 5 --save-scores ig.pt
    .venv/bin/python benchmarks/circuit_selection.py smollm2 ioi eap --mib-grid

Scores every edge of the model's graph once (exact, eap or eap-ig with --steps), or reads them back
(--scores FILE, saved by --save-scores), then for each selection (--selections, default top and greedy:
the n largest |score|, EAP-IG's `apply_topn`, or grown from the logits, `apply_greedy`; each circuit
pruned to the nodes on a path from the input to the logits; --selections "" measures none, e.g. to
only save the scores):
- the faithfulness curve over a --points log grid (default 20, as `headlens circuit --discover`),
  CPR (area under f) and CMD (area under |1 - f|), MIB's normalised areas;
- for f >= 0.8 and 0.9: the first grid point reaching it, bisected down to a bracket (low, high] whose
  width is at most --tol of high (default 0.05; 0 bisects to the exact k, as discover does), and the
  pruned size of the circuit at high;
- with --mib-grid, also f at MIB's grid (0.1% ... 20% of the edges; MIB-circuit-track
  evaluate_area_under_curve).
--counterfactual s2-io-flip patches IOI from MIB's default counterfactual instead of the ABC run.
With --signed, edges are ranked by their signed benefit (how much the edge's clean value moves the
metric the task's good way: -score where higher is better, +score where lower is better) instead of
|score|: MIB's and EAP-IG's `absolute=False` (EAP-IG's own IOI example grows its circuit greedily
with absolute=False); an edge that works against the behaviour is then added last.
CPU seconds (this process, all threads) are printed beside each step.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from headlens.circuits.discover import Curve, area, log_grid, ranking
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.circuits.tasks import ioi_task
from headlens.load.models import load_model

MIB_SHARES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
TARGETS = (0.8, 0.9)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("task", nargs="?", default="ioi")
    parser.add_argument("method", nargs="?", default="eap", choices=("exact", "eap", "eap-ig"))
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    parser.add_argument("--selections", default="top,greedy")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--tol", type=float, default=0.05, help="bisection's relative bracket width")
    parser.add_argument("--mib-grid", action="store_true")
    parser.add_argument("--counterfactual", default="abc", help="IOI's counterfactual: abc or s2-io-flip (MIB's)")
    parser.add_argument("--signed", action="store_true", help="rank by signed benefit, not |score|")
    parser.add_argument("--scores", help="read the scores from this file instead of computing them")
    parser.add_argument("--save-scores", help="write the scores to this file (torch.save)")
    return parser.parse_args(argv)


def cpu_since(start: float) -> str:
    return f"{time.process_time() - start:.1f} CPU s"


def one_selection(gt: GraphTask, scores: torch.Tensor, selection: str, args) -> None:
    start = time.process_time()
    curve = Curve(gt, scores, selection)
    grid = log_grid(gt.graph.n_edges, args.points)
    fs = [curve.circuit(k)[1] for k in grid]
    cpr, cmd = area(grid, fs), area(grid, [abs(1 - f) for f in fs])
    print(f"{selection}: curve {[(k, round(f, 3)) for k, f in zip(grid, fs, strict=True)]}", flush=True)
    print(f"{selection}: CPR {cpr:.3f} CMD {cmd:.3f} ({cpu_since(start)})", flush=True)
    for target in TARGETS:
        found = curve.bracket(target, grid, args.tol)
        if found is None:
            print(f"{selection}: f >= {target}: not reached")
            continue
        low, high = found
        keep, f = curve.circuit(high)
        print(
            f"{selection}: f >= {target}: k in ({low}, {high}] ({high / gt.graph.n_edges:.1%} of the edges), "
            f"f({high}) {f:.3f}, pruned {int(keep.sum())} edges ({cpu_since(start)})",
            flush=True,
        )
    if args.mib_grid:
        for share in MIB_SHARES:
            k = max(1, int(share * gt.graph.n_edges))
            keep, f = curve.circuit(k)
            print(f"  {selection} {share:.1%}: k {k}, pruned {int(keep.sum())} edges, f {f:.3f}", flush=True)


def main(argv=None) -> None:
    args = parse(argv)
    loaded = load_model(args.model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    start = time.process_time()
    task = circuit_task(loaded, args.task)
    if args.task == "ioi" and args.counterfactual != "abc":
        task = ioi_task(loaded, counterfactual=args.counterfactual)
    print(task.description)
    gt = GraphTask(loaded, task)
    full, empty = gt.ends()
    print(f"{args.model} {args.task}: {gt.graph.n_edges} edges; m(model) {full:.4f}, m(empty) {empty:.4f}")
    print(f"reference run and ends: {cpu_since(start)}", flush=True)
    start = time.process_time()
    if args.scores:
        scores = torch.load(args.scores)
        print(f"{args.method} scores read from {args.scores}")
    else:
        scores = gt.scores(args.method, args.steps)
        print(f"{args.method} scores ({args.steps} steps if eap-ig): {cpu_since(start)}", flush=True)
    if args.save_scores:
        torch.save(scores, args.save_scores)
    if args.signed:  # discover's "signed" ranking, then each selection over it
        scores = ranking(gt, scores, "signed")
        print("ranked by signed benefit (absolute=False)")
    for selection in filter(None, args.selections.split(",")):  # --selections "": the scores only
        one_selection(gt, scores, selection, args)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
