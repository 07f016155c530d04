"""What limits EAP-IG against exact patching: integration steps, quadrature rules, and the path itself.

    .venv/bin/python benchmarks/eapig_limits.py smollm2 ioi --points 20 --out path.pt
    .venv/bin/python benchmarks/eapig_limits.py smollm2 ioi --points 40 --odd --out path.pt
    .venv/bin/python benchmarks/eapig_limits.py smollm2 ioi --analyse path.pt --eap ioi_eap.pt \
        --eap-ig ioi_ig.pt --cache ioi_exact.pt --curves "right Riemann 5 (headlens);trapezoid 20" --along 16

Scoring (--points N): the path term of every edge at each point alpha = k / N, k = 0..N, of EAP-IG's
path (input embeddings reference + alpha (clean - reference)): (reference_s - out_s) . dm/dx_r at that
point, one [senders, receivers] matrix per alpha (GraphTask's own gradient passes), merged into --out
(keys (k, N) reduced); --odd computes only odd k (the points a grid of N / 2 lacks). Each quadrature
rule is then a weighted sum of these matrices: EAP is alpha 1 alone; headlens's EAP-IG with n steps
the right Riemann sum (k = 1..n); hannamw/EAP-IG's current `get_scores_eap_ig` the left one
(k = 0..n-1); the trapezoid rule; "clean-corrupted" (the package's method of that name) the mean of
alpha 0 and 1.

Analysis (--analyse): on the candidate set U of circuit_eap_vs_exact.py --subgraph (the union of the
saved EAP and EAP-IG score files' top --subgraph edges), each rule against the exact scores of --cache
(m(M minus e) - m(M)): Spearman (signed), top-20 recall, Pearson, and the faithfulness of the circuits
of U's first k edges by each ranking against exact's (largest and mean gap over the grid). The saved
files are first checked against the recomputed alpha-1 and 5-step rules (same task), and each rule's top 100
and 1,000 edges of the whole graph are compared with the converged rule's (--converged); the faithfulness
curves are measured for the rules named in --curves; each single point's term is set against exact too. Then
the error over U split into discretisation (rms of 5 steps minus converged) and path (rms of converged minus
exact), and, for the first --along edges in exactly one of exact's and the converged rule's top 20 (what
top-20 recall counts), the exact single-edge path: m with only edge e moved half way to its reference,
m_e(1/2) - m(M), doubled. Its slope at 0 is EAP's score and its value at 1 the exact one; the converged
EAP-IG integrates the same edge term along the path where every edge moves at once. An edge whose doubled
midpoint is near exact (a straight own path) but whose EAP-IG is not owes its effect to the other edges'
state (interaction); one whose own path bends defeats EAP's slope.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import torch
from circuit_eap_vs_exact import candidates, frame, make, subgraph_f

from headlens.circuits.attribution import edge_agreement
from headlens.circuits.discover import log_grid
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.graphrun import run_graph
from headlens.intervene.replace import frozen_weights
from headlens.load.models import load_model

POINTS = 12


def reduced(k: int, n: int) -> tuple[int, int]:
    g = math.gcd(k, n)
    return k // g, n // g


def path_terms(gt: GraphTask, alphas: list[tuple[int, int]]) -> dict:
    """{(k, n): [senders, receivers] float64}: each edge's (reference_s - out_s) . dm/dx_r with the
    input embeddings at reference + k/n (clean - reference), averaged over the read positions."""
    out = {a: torch.zeros(gt.graph.real.shape, dtype=torch.float64) for a in alphas}
    with frozen_weights(gt.model):
        for b in gt.batches:
            with torch.inference_mode():
                clean = run_graph(gt.adapter, gt.graph, b.ctx, gt.graph.real)[1]
            with torch.no_grad():
                clean_embed = gt.adapter.embed_tokens(b.ctx)  # [batch, pos, d_model]
            diffs = (b.ref.outs - clean.outs).transpose(0, 1).flatten(2)  # [batch, senders, pos * d_model]
            ones = torch.ones(1, diffs.shape[0], dtype=torch.float64)  # [1, batch]: every sequence once
            for k, n in alphas:
                ref_embed = b.ref.outs[0]  # [batch, pos, d_model]
                embed = None if k == n else ref_embed + (k / n) * (clean_embed - ref_embed)
                grads, _ = gt._input_grads(b, embed)
                gt._add_scores(out[k, n].unsqueeze(0), diffs, grads, ones)
                del grads
    return {a: m / gt.n_read for a, m in out.items()}


def score(args, loaded) -> None:
    gt = GraphTask(loaded, make(loaded, args.task))
    done = torch.load(args.out) if os.path.exists(args.out) else {}
    ks = range(1, args.points + 1, 2) if args.odd else range(args.points + 1)
    todo = sorted({reduced(k, args.points) for k in ks} - set(done))
    start = time.process_time()
    for a in todo:  # one point at a time, saved after each, so a stopped run resumes
        done.update(path_terms(gt, [a]))
        torch.save(done, args.out)
        print(f"alpha {a[0]}/{a[1]}: {time.process_time() - start:.1f} CPU s so far", flush=True)
    print(f"{len(todo)} points in {time.process_time() - start:.1f} CPU s; file holds {len(done)}")


def term(path: dict, k: int, n: int) -> torch.Tensor:
    return path[reduced(k, n)]


def rules(path: dict) -> dict:
    """Every quadrature rule the saved points allow (module docstring)."""
    have = {n for _, n in path}
    grids = [n for n in (1, 2, 4, 5, 8, 10, 16, 20, 40, 80) if all(reduced(k, n) in path for k in range(n + 1))]
    out = {"EAP (alpha 1)": term(path, 1, 1), "alpha 0 alone": term(path, 0, 1)}
    out["clean-corrupted (alpha 0, 1)"] = (term(path, 0, 1) + term(path, 1, 1)) / 2
    for n in grids:
        if n < 5 and n != 2:
            continue
        pts = [term(path, k, n) for k in range(n + 1)]
        out[f"right Riemann {n} (headlens)"] = sum(pts[1:]) / n
        out[f"left Riemann {n} (EAP-IG package)"] = sum(pts[:-1]) / n
        out[f"trapezoid {n}"] = (sum(pts[1:-1]) + (pts[0] + pts[-1]) / 2) / n
    print(f"points held: {len(path)} (grids {sorted(have)}; complete: {grids})")
    return out


def check_saved(path: dict, approx: dict) -> None:
    """The saved score files against the recomputed alpha-1 and 5-step right rule (same task and code)."""
    eap = term(path, 1, 1)
    print(f"saved EAP file vs alpha 1 recomputed: max |diff| {(approx['eap'] - eap).abs().max():.3g}")
    if all(reduced(k, 5) in path for k in range(1, 6)):
        ig5 = sum(term(path, k, 5) for k in range(1, 6)) / 5
        print(f"saved EAP-IG file vs right Riemann 5 recomputed: max |diff| {(approx['eap-ig'] - ig5).abs().max():.3g}")


def analyse(args, loaded) -> None:
    gt = GraphTask(loaded, make(loaded, args.task))
    path = torch.load(args.analyse)
    approx = {"eap": torch.load(args.eap), "eap-ig": torch.load(args.eap_ig)}
    check_saved(path, approx)
    edges = candidates(gt, approx, args.subgraph)
    cache = torch.load(args.cache)
    exact = torch.tensor([cache[e] for e in edges], dtype=torch.float64)
    index = tuple(torch.tensor(edges).T)
    truth = frame(gt, edges, exact.tolist(), "effect")
    every = rules(path)
    ranked = {name: matrix[index] for name, matrix in every.items()}
    whole_graph(gt, every, args.converged)
    for name, values in ranked.items():
        agree = edge_agreement(truth, frame(gt, edges, values.tolist(), "attribution"), 20)
        print(
            f"U = {len(edges)}: {name}: Spearman {agree['spearman']:.3f}, top-20 recall {agree['top_k_recall']:.2f}, "
            f"Pearson {agree['pearson']:.3f}, wrong sign {agree['top_flipped']}",
            flush=True,
        )
    per_alpha(gt, edges, truth, path)
    if args.curves:
        curves(gt, index, exact, {name: ranked[name] for name in args.curves.split(";")})
    if args.along:
        along(gt, edges, exact, ranked, args)


def whole_graph(gt, every: dict, converged: str) -> None:
    """On every edge of the graph: each rule's top 100 and top 1,000 by |score| shared with the converged rule's."""
    real = gt.graph.real

    def top(matrix, n):
        return set(matrix.abs().masked_fill(~real, -1.0).flatten().argsort(descending=True)[:n].tolist())

    ref = {n: top(every[converged], n) for n in (100, 1000)}
    for name, matrix in every.items():
        shared = [len(top(matrix, n) & ref[n]) / n for n in (100, 1000)]
        print(f"whole graph: {name}: top-100 shared with {converged} {shared[0]:.2f}, top-1000 {shared[1]:.2f}")


def per_alpha(gt, edges, truth, path) -> None:
    """Each single point's term against exact: where on the path the gradient agrees with patching."""
    index = tuple(torch.tensor(edges).T)
    for a in sorted(path, key=lambda a: a[0] / a[1]):
        agree = edge_agreement(truth, frame(gt, edges, path[a][index].tolist(), "attribution"), 20)
        print(
            f"  alpha {a[0]}/{a[1]}: Spearman {agree['spearman']:.3f}, recall {agree['top_k_recall']:.2f}, "
            f"Pearson {agree['pearson']:.3f}"
        )


def curves(gt, index, exact, chosen: dict) -> None:
    """Faithfulness within U of each ranking's first k edges against exact's; equal circuits measured once."""
    full, empty = gt.ends()
    grid = log_grid(len(exact), POINTS)
    seen: dict = {}

    def f(values, k):
        first = values.abs().argsort(descending=True, stable=True)[:k]
        key = tuple(sorted(first.tolist()))
        if key not in seen:
            seen[key] = subgraph_f(gt, index, values, k, full, empty)
        return seen[key]

    base = [f(exact, k) for k in grid]
    print("  k: " + " ".join(f"{k:6d}" for k in grid))
    print("  exact: " + " ".join(f"{v:+.3f}" for v in base), flush=True)
    for name, values in chosen.items():
        fs = [f(values, k) for k in grid]
        gap = np.abs(np.asarray(fs) - np.asarray(base))
        print(f"  {name}: " + " ".join(f"{v:+.3f}" for v in fs))
        print(f"  {name}: max |gap| {gap.max():.3f} at k {grid[int(gap.argmax())]}, mean {gap.mean():.3f}", flush=True)


def along(gt, edges, exact, ranked, args) -> None:
    """The exact single-edge path at t = 1/2 for the edges in exactly one of exact's and the converged
    rule's top 20 (what top-20 recall counts), and the error split over all of U."""
    conv, ig5 = ranked[args.converged], ranked["right Riemann 5 (headlens)"]
    rms = lambda x: float(x.pow(2).mean().sqrt())  # noqa: E731
    print(
        f"over U: rms |exact| {rms(exact):.4f}; rms (right 5 - {args.converged}) {rms(ig5 - conv):.4f} "
        f"(discretisation); rms ({args.converged} - exact) {rms(conv - exact):.4f} (the path)"
    )
    rank_e = exact.abs().argsort(descending=True).argsort()
    rank_c = conv.abs().argsort(descending=True).argsort()
    chosen = ((rank_e < 20) ^ (rank_c < 20)).nonzero().flatten().tolist()[: args.along]
    cleans = gt._clean_runs()
    base = gt.ends()[0]
    print("edge | exact | m_e(1/2)/(1/2) | EAP | right 5 | converged | rank exact / converged")
    for i in chosen:
        s, r = edges[i]
        half = 2 * (half_patched(gt, cleans, s, r) - base)
        print(
            f"{gt.graph.edge_name(s, r)} | {exact[i]:+.4f} | {half:+.4f} | {ranked['EAP (alpha 1)'][i]:+.4f} | "
            f"{ig5[i]:+.4f} | {conv[i]:+.4f} | {int(rank_e[i]) + 1} / {int(rank_c[i]) + 1}",
            flush=True,
        )


def half_patched(gt, cleans, s: int, r: int) -> float:
    """m with edge (s, r) alone moved half way to its reference: the batches' reference output of s is
    set to the midpoint of clean and reference for the pass, then restored."""
    saved = [b.ref.outs[s].clone() for b in gt.batches]
    try:
        for b, clean in zip(gt.batches, cleans, strict=True):
            b.ref.outs[s] = (b.ref.outs[s] + clean.outs[s]) / 2
        return next(gt.exact_edges([(s, r)])) + gt.ends()[0]
    finally:
        for b, value in zip(gt.batches, saved, strict=True):
            b.ref.outs[s] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("task", nargs="?", default="ioi")
    parser.add_argument("--points", type=int, default=20, help="N: score the points k / N")
    parser.add_argument("--odd", action="store_true", help="only odd k")
    parser.add_argument("--out", help="the path terms' file, read and written")
    parser.add_argument("--analyse", help="a path terms' file to analyse")
    parser.add_argument("--subgraph", type=int, default=100)
    parser.add_argument("--eap", help="EAP's saved scores (circuit_selection.py --save-scores)")
    parser.add_argument("--eap-ig", help="EAP-IG's (5 steps) saved scores")
    parser.add_argument("--cache", help="exact scores of U (circuit_eap_vs_exact.py --cache)")
    parser.add_argument("--curves", default="", help="rules whose faithfulness curves to measure, ';'-separated")
    parser.add_argument("--along", type=int, default=0, help="edges to follow along their single-edge path")
    parser.add_argument("--converged", default="trapezoid 20", help="the rule taken as converged")
    args = parser.parse_args()
    loaded = load_model(args.model)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    start = time.process_time()
    (analyse if args.analyse else score)(args, loaded)
    print(f"{time.process_time() - start:.1f} CPU s; load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
