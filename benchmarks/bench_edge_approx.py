"""Edge attribution (EAP, EAP-IG, EAP*) and head attribution (AtP, AtP*) against their exact references.

    .venv/bin/python benchmarks/bench_edge_approx.py edges smollm2 --task ioi --prompts 8 --receivers 4 \
        --ablation zero --methods eap eap-ig:5 'eap*' [--exact-cache FILE.pkl] [--out FILE.json]
    .venv/bin/python benchmarks/bench_edge_approx.py heads smollm2 ioi:8:patch ioi:8:zero repeat:2:zero

edges: the task's first `--prompts` prompts (ioi: template prompts with their ABC run; induction:
2 x 12 repeated tokens); receivers are the `--receivers` heads of largest |direct effect| on the clean
run (headlens.circuits.direct), or `--receiver-heads L.H,L.H`; exact path patching
(headlens.circuits.paths) of every edge into them (q, k, v) and of every direct edge, then each
method's attributions of every edge of the model, and edge_agreement (Spearman, Pearson, top-20
recall) on the patched edges. `--ablation patch` takes each sender's z from the corrupted run at the
same position (headlens.circuits.paths.PATCH), which EAP-IG reaches by interpolating the input
embeddings (Hanna et al. 2024); zero, mean and resample interpolate z.
heads: every single head ablated exactly (the sweep) against AtP and AtP* (headlens.ablation.gradients),
agreement (Spearman, Pearson, top-10 overlap): TASK:N:ABLATION, TASK ioi (N prompts) or repeat (N
sequences of 2 x 12 tokens), ABLATION zero or patch (ioi only).
Times are wall and CPU seconds of this process; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from headlens.ablation.approx import ESTIMATES, agreement  # noqa: E402
from headlens.circuits.attribution import edge_agreement, edge_attribution  # noqa: E402
from headlens.circuits.direct import decompose  # noqa: E402
from headlens.circuits.paths import PATCH, counterfactual_replacements, path_patch  # noqa: E402
from headlens.circuits.tasks import induction_task, ioi_task  # noqa: E402
from headlens.heads import Head, all_heads  # noqa: E402
from headlens.intervene.evalset import repeat_evalset  # noqa: E402
from headlens.intervene.sums import base_sums, sweep_sums  # noqa: E402
from headlens.load.models import load_model  # noqa: E402


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu, 1)}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def edges(args) -> dict:
    loaded = load_model(args.model)
    if args.task == "ioi":
        task = ioi_task(loaded, n=args.prompts, seed=args.seed)
    else:
        task = induction_task(loaded, n=args.prompts, seq_len=12, seed=args.seed)
    clean = decompose(loaded, task)
    n_heads = clean.heads.shape[1]
    top = torch.topk(clean.heads.flatten().abs(), args.receivers).indices.tolist()
    receivers = sorted(Head(i // n_heads, i % n_heads) for i in top)
    if args.receiver_heads:
        receivers = [Head(*map(int, name.split("."))) for name in args.receiver_heads.split(",")]
    figures: dict = {"receivers": [str(r) for r in receivers], "clean_metric": clean.metric, "load": load_average()}
    cache = Path(args.exact_cache) if args.exact_cache else None
    if cache is not None and cache.exists():
        exact = pickle.loads(cache.read_bytes())
    else:
        exact, figures["exact"] = timed(
            lambda: path_patch(loaded, task, receivers=receivers, method=args.ablation).frame
        )
        if cache is not None:
            cache.write_bytes(pickle.dumps(exact))
    figures["n_edges"] = len(exact)
    print(json.dumps(figures), flush=True)
    for spec in args.methods:
        name, steps = (spec.split(":") + ["5"])[:2]
        frame, cost = timed(
            lambda name=name, steps=steps: (
                edge_attribution(loaded, task, name, int(steps), args.ablation, args.seed).frame
            )
        )
        row = {**cost, "load": load_average(), "all": edge_agreement(exact, frame, k=20)}
        row["receiver_edges"] = edge_agreement(exact[exact["via"] != "direct"], frame, k=20)
        figures[spec] = row
        print(spec, json.dumps(row), flush=True)
    return figures


def head_frame(deltas: torch.Tensor, column: str):
    import pandas as pd

    n_layers, n_heads = deltas.shape
    rows = [(layer, head, float(deltas[layer, head])) for layer in range(n_layers) for head in range(n_heads)]
    return pd.DataFrame(rows, columns=["layer", "head", column])


def exact_sweep(loaded, evalset, reps) -> torch.Tensor:
    """Every head ablated alone, exactly: [layer, head], mean over scored positions."""
    spec, found = loaded.spec, {}
    base = base_sums(loaded.model, evalset)  # [n_units]
    heads = all_heads(spec.n_layers, spec.n_heads)
    sweep_sums(loaded.model, evalset, heads, reps, lambda h, s: found.update({h: float((s - base).sum())}))
    return torch.tensor([[found[h] for h in heads]]).view(spec.n_layers, spec.n_heads) / evalset.n_tokens


def heads(args) -> dict:
    loaded = load_model(args.model)
    figures: dict = {}
    for spec in args.runs:
        task, n, ablation = spec.split(":")
        if task == "repeat":
            evalset = repeat_evalset(loaded, seed=args.seed, n_seq=int(n), seq_len=12)
        else:
            evalset = ioi_task(loaded, n=int(n), seed=args.seed).evalset()
        reps = (
            counterfactual_replacements(loaded.model, evalset) if ablation == PATCH else [None] * loaded.spec.n_layers
        )
        exact, cost = timed(lambda evalset=evalset, reps=reps: exact_sweep(loaded, evalset, reps))
        rows = {"exact": {**cost, "load": load_average()}}
        for kind in ("atp", "atp*"):
            got, cost = timed(lambda fn=ESTIMATES[kind], evalset=evalset, reps=reps: fn(loaded.model, evalset, reps))
            found = agreement(head_frame(exact, "delta"), head_frame(got, "delta_approx"))
            rows[kind] = {**cost, "load": load_average(), **found}
        figures[spec] = rows
        print(spec, json.dumps(rows), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("edges")
    one.add_argument("model")
    one.add_argument("--task", choices=["ioi", "induction"], default="ioi")
    one.add_argument("--prompts", type=int, default=8)
    one.add_argument("--receivers", type=int, default=4)
    one.add_argument("--receiver-heads", default=None, help="L.H,L.H: these receivers instead")
    one.add_argument("--ablation", default="zero")
    one.add_argument("--methods", nargs="+", default=["eap", "eap-ig:5", "eap*"])
    one.add_argument("--exact-cache", default=None)
    two = sub.add_parser("heads")
    two.add_argument("model")
    two.add_argument("runs", nargs="+")
    for p in (one, two):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    figures = edges(args) if args.what == "edges" else heads(args)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
