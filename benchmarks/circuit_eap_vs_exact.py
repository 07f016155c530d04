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

    .venv/bin/python benchmarks/circuit_eap_vs_exact.py smollm2 ioi --subgraph 100 \
        --eap ioi_eap.pt --eap-ig ioi_ig.pt --cache ioi_exact.pt --budget 480

On a graph too large for the exact sweep (SmolLM2: ~7 days), a subgraph comparison: the candidate set U
is the union of EAP's and EAP-IG's top M edges by |score| (their saved score files, from
benchmarks/circuit_selection.py --save-scores); each edge of U is scored exactly (one patched pass each,
m(M minus e) - m(M)), kept in the --cache file and resumed from it, at most --budget CPU seconds of
passes per run. Once every edge of U is scored: per-edge Spearman (signed) and top-20 recall of EAP and
EAP-IG against exact on U, and the faithfulness of the circuits made of U's k edges ranked first by
each (|exact|, |EAP|, |EAP-IG|; pruned; every edge outside the circuit patched, U's other edges and
the rest of the graph alike), on a log grid of k up to |U|, with each approximation's largest and mean
|f - f(exact's)| (--sizes K,K,...: f of each ranking's circuit at these k too, outside the grid's
figures). Edges outside U are in no circuit of this comparison: it says how well EAP orders the
edges it (or EAP-IG) already ranks high, not whether it misses edges exact patching would rank high.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd
import torch

from headlens.circuits.attribution import edge_agreement
from headlens.circuits.discover import Curve, log_grid
from headlens.circuits.faithfulness import GraphTask, faithfulness
from headlens.circuits.graph import prune
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


def candidates(gt, scores: dict, m: int) -> list[tuple[int, int]]:
    """The union of each score matrix's top m real edges by |score|, in forward order."""
    union = torch.zeros_like(gt.graph.real)
    for matrix in scores.values():
        flat = matrix.abs().masked_fill(~gt.graph.real, -1.0).flatten()
        union.view(-1)[flat.argsort(descending=True)[:m]] = True
    return [tuple(e) for e in (union & gt.graph.real).nonzero().tolist()]


def exact_on(gt, edges, cache: str | None, budget: float) -> dict:
    """Exact scores of `edges`: read from `cache`, the missing ones computed (at most `budget` CPU s of
    passes), saved back after each edge."""
    done = torch.load(cache) if cache and os.path.exists(cache) else {}
    start = time.process_time()
    todo = [e for e in edges if e not in done]
    for edge, score in zip(todo, gt.exact_edges(todo), strict=False):
        done[edge] = score
        if cache:
            torch.save(done, cache)
        if time.process_time() - start > budget:
            break
    cpu = time.process_time() - start
    print(f"exact: {len(done)} of {len(edges)} candidate edges scored ({cpu:.1f} CPU s this run)", flush=True)
    return done


def frame(gt, edges, values, column: str) -> pd.DataFrame:
    names = [gt.graph.edge_name(s, r) for s, r in edges]
    return pd.DataFrame({"sender": names, "receiver": "", "via": "", column: values})


def subgraph(loaded, spec: str, args) -> None:
    """The subgraph comparison (module docstring)."""
    gt = GraphTask(loaded, make(loaded, spec))
    approx = {"eap": torch.load(args.eap), "eap-ig": torch.load(args.eap_ig)}
    edges = candidates(gt, approx, args.subgraph)
    exact = exact_on(gt, edges, args.cache, args.budget)
    if len(exact) < len(edges):
        print("not every candidate scored yet: run again to resume")
        return
    truth = frame(gt, edges, [exact[e] for e in edges], "effect")
    for name, matrix in approx.items():
        agree = edge_agreement(truth, frame(gt, edges, [float(matrix[e]) for e in edges], "attribution"), 20)
        print(
            f"{spec} U = {len(edges)} edges: {name} vs exact: Spearman {agree['spearman']:.3f}, "
            f"top-{agree['top_k']} recall {agree['top_k_recall']:.2f}, Pearson {agree['pearson']:.3f}, "
            f"top edges with the wrong sign {agree['top_flipped']}"
        )
    index = tuple(torch.tensor(edges).T)
    rankings = {"exact": torch.tensor([exact[e] for e in edges], dtype=torch.float64)}
    rankings.update({name: matrix[index] for name, matrix in approx.items()})
    full, empty = gt.ends()
    grid = log_grid(len(edges), POINTS)
    curves = {name: [subgraph_f(gt, index, values, k, full, empty) for k in grid] for name, values in rankings.items()}
    print("  k       " + "  ".join(curves))
    for i, k in enumerate(grid):
        print(f"  {k:6d}  " + "  ".join(f"{c[i]:+.3f}" for c in curves.values()), flush=True)
    for name in approx:
        gap = np.abs(np.asarray(curves[name]) - np.asarray(curves["exact"]))
        print(
            f"{spec} {name} vs exact within U: max |gap| {gap.max():.3f} at k {grid[int(gap.argmax())]}, "
            f"mean {gap.mean():.3f}"
        )
    for k in (k for k in args.sizes if k <= len(edges)):
        fs = "  ".join(
            f"{name} {subgraph_f(gt, index, values, k, full, empty):+.3f}" for name, values in rankings.items()
        )
        print(f"{spec} within U at k {k}: {fs}", flush=True)


def subgraph_f(gt, index, values: torch.Tensor, k: int, full: float, empty: float) -> float:
    """Faithfulness of the circuit of the k edges of U with the largest |values| (pruned)."""
    keep = torch.zeros_like(gt.graph.real)
    first = values.abs().argsort(descending=True, stable=True)[:k]
    keep[index[0][first], index[1][first]] = True
    return faithfulness(gt.metric(prune(gt.graph, keep)), full, empty)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="tiny")
    parser.add_argument("tasks", nargs="*", default=["induction:4:12"])
    parser.add_argument("--subgraph", type=int, help="M: compare on the union of EAP's and EAP-IG's top M")
    parser.add_argument("--eap", help="EAP's scores (circuit_selection.py --save-scores)")
    parser.add_argument("--eap-ig", help="EAP-IG's scores")
    parser.add_argument("--cache", help="exact scores of the candidates, read and written")
    parser.add_argument("--budget", type=float, default=480.0, help="CPU seconds of exact passes per run")
    parser.add_argument(
        "--sizes", type=lambda v: [int(k) for k in v.split(",")], default=[], help="k,k,...: f at these sizes too"
    )
    args = parser.parse_args()
    loaded = load_model(args.model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    for spec in args.tasks:
        if args.subgraph:
            subgraph(loaded, spec, args)
        else:
            compare(loaded, spec)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
