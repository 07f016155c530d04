"""Circuits on a real model: composition cost and the induction circuit's K-composition, edge
attribution (EAP, EAP-IG) cost, and its agreement with exact path patching on a subset of edges.

    .venv/bin/python benchmarks/bench_circuits.py smollm2 [--receivers 2] [--out FILE.json]

1. composition_scores for all pairs, timed beside a reference float32 matmul (GFLOP/s of this machine
   now, so a loaded machine's figure can be read);
2. previous-token and induction heads by attention (tests/helpers/circuits_roles.py), K-composition p-value
   against 100 random sender sets;
3. on the induction task (2 x 12 repeated random tokens, 2 sequences, zero ablation): EAP and EAP-IG
   (5 steps) of every edge; exact path patching of every edge into the earliest `--receivers`
   induction heads (q, k, v) and every direct edge; the exact cost of all edges extrapolated by the
   work path patching does (senders x layers run after the receiver, per receiver input);
   Spearman and top-20 recall of each estimate on the patched edges.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.helpers

from headlens.circuits.attribution import edge_agreement, edge_attribution  # noqa: E402
from headlens.circuits.composition import composition_scores  # noqa: E402
from headlens.circuits.paths import path_patch  # noqa: E402
from headlens.circuits.tasks import induction_task  # noqa: E402
from headlens.load.models import load_model  # noqa: E402
from tests.helpers.circuits_roles import attention_roles, permutation_p  # noqa: E402


def matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def work(n_layers: int, n_heads: int, receivers) -> int:
    """Senders x layers run after the receiver, summed over receivers and their 3 inputs."""
    return sum(3 * r.layer * n_heads * (n_layers - r.layer) for r in receivers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--composition-only", action="store_true")
    args = parser.parse_args()
    figures: dict = {"model": args.model, "gflops_before": matmul_gflops()}
    loaded = load_model(args.model)
    spec = loaded.spec
    comp, figures["composition_s"] = timed(lambda: composition_scores(loaded).frame)
    figures["gflops_after_composition"] = matmul_gflops()
    figures["baseline"] = [float(comp["composition_baseline"].iloc[0]), float(comp["composition_baseline_std"].iloc[0])]
    prev, induction = attention_roles(loaded)
    figures["roles"] = {"previous_token": [str(h) for h in prev], "induction": [str(h) for h in induction]}
    for via in ("q", "k", "v"):
        part = comp[comp["via"] == via]
        values = dict(zip(zip(part["sender"], part["receiver"], strict=True), part["composition"], strict=True))
        figures[f"{via}_composition_prev_to_induction"] = permutation_p(values, prev, induction, spec.n_heads)
    print(json.dumps(figures, indent=1), flush=True)
    if args.composition_only:
        return
    task = induction_task(loaded, n=2, seq_len=12, seed=5)
    eap, figures["eap_s"] = timed(lambda: edge_attribution(loaded, task, "eap").frame)
    ig, figures["eap_ig5_s"] = timed(lambda: edge_attribution(loaded, task, "eap-ig", steps=5).frame)
    receivers = sorted(induction)[: args.receivers]
    exact, figures["exact_subset_s"] = timed(lambda: path_patch(loaded, task, receivers=receivers).frame)
    figures["exact_subset_edges"] = len(exact)
    all_heads = [type(receivers[0])(layer, h) for layer in range(spec.n_layers) for h in range(spec.n_heads)]
    share = work(spec.n_layers, spec.n_heads, receivers) / work(spec.n_layers, spec.n_heads, all_heads)
    figures["exact_all_edges_estimated_s"] = figures["exact_subset_s"] / share
    figures["n_edges"] = len(eap)
    for name, frame in (("eap", eap), ("eap_ig5", ig)):
        figures[f"{name}_agreement"] = edge_agreement(exact, frame, k=20)
        receiver_only = exact[exact["via"] != "direct"]
        figures[f"{name}_agreement_receiver_edges"] = edge_agreement(receiver_only, frame, k=20)
    figures["gflops_end"] = matmul_gflops()
    text = json.dumps(figures, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
