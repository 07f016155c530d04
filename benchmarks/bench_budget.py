"""Classify a real model under the default token budget and under K times it: time and labels.
With `--vary windows`, the budget stays and the natural-text windows go from W to K x W instead.

Each budget runs in a fresh subprocess (model load included, as `headlens classify` pays it): wall
seconds and CPU seconds (user + system of the process, all threads) for the load, each probe
(headlens.classify.kinds.PROBES) and the labelling; then the labels of every head at the two budgets are
compared and the heads that differ listed. The machine is shared: CPU seconds are the figure that
does not depend on the load; `uptime` is printed before and after.

    .venv/bin/python benchmarks/bench_budget.py MODEL [--factor 4] [--budget N] [--max-windows W]
        [--vary budget|windows] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def key(budget: int, max_windows: int) -> str:
    return f"budget{budget}_windows{max_windows}"


def child(model: str, budget: int, out: Path, max_windows: int) -> None:
    """One classify run at `budget` and `max_windows`, every probe timed; the frame goes to
    out/heads_<key>.json."""
    from headlens.classify import classify_heads, head_records, kinds
    from headlens.classify.labels import ClassifyConfig
    from headlens.load.models import load_model

    timings = {}

    def timed(name, probe):
        original = probe.run  # the bound method, before the instance attribute below hides it

        def run(shared):
            wall, used = time.perf_counter(), cpu()
            result = original(shared)
            timings[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu() - used}
            return result

        return run

    wall, used = time.perf_counter(), cpu()
    loaded = load_model(model)
    timings["load"] = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu() - used}
    for name, probe in list(kinds.PROBES.items()):
        object.__setattr__(probe, "run", timed(name, probe))
    wall, used = time.perf_counter(), cpu()
    heads = classify_heads(loaded, config=ClassifyConfig(token_budget=budget, max_windows=max_windows))
    frame = heads.frame
    timings["classify"] = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu() - used}
    sizes = heads.meta["probes"]["sizes"]
    (out / f"heads_{key(budget, max_windows)}.json").write_text(json.dumps(head_records(frame), default=str))
    print(
        json.dumps(
            {
                "budget": budget,
                "max_windows": max_windows,
                "sizes": sizes,
                "timings": timings,
                "n_needle_retrieved": int(frame["n_needle_retrieved"].iloc[0]),
                "n_needle_tests": int(frame["n_needle_tests"].iloc[0]),
            }
        )
    )


def compare(out: Path, low: str, high: str) -> dict:
    """Heads whose labels differ between the two runs (keys), and the label counts at each."""
    a = {(r["layer"], r["head"]): r["labels"] for r in json.loads((out / f"heads_{low}.json").read_text())}
    b = {(r["layer"], r["head"]): r["labels"] for r in json.loads((out / f"heads_{high}.json").read_text())}
    differ = {
        f"{layer}.{head}": {str(low): a[layer, head], str(high): b[layer, head]}
        for layer, head in sorted(a)
        if a[layer, head] != b[layer, head]
    }

    def counts(labels):
        found = {}
        for names in labels.values():
            for name in names:
                found[name] = found.get(name, 0) + 1
        return found

    return {
        "n_heads": len(a),
        "n_differ": len(differ),
        "differ": differ,
        "counts": {str(low): counts(a), str(high): counts(b)},
    }


def main() -> None:
    from headlens.classify.kinds import DEFAULT_TOKEN_BUDGET
    from headlens.classify.labels import ClassifyConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--max-windows", type=int, default=ClassifyConfig.max_windows)
    parser.add_argument("--vary", choices=("budget", "windows"), default="budget")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_budget"))
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        child(args.model, args.child, args.out, args.max_windows)
        return
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    runs = [(args.budget, args.max_windows)]
    runs.append(
        (args.budget * args.factor, args.max_windows)
        if args.vary == "budget"
        else (args.budget, args.max_windows * args.factor)
    )
    for budget, max_windows in runs:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                args.model,
                "--out",
                str(args.out),
                "--child",
                str(budget),
                "--max-windows",
                str(max_windows),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(done.stdout.strip().splitlines()[-1])
        print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(json.dumps(compare(args.out, key(*runs[0]), key(*runs[1])), indent=1))


if __name__ == "__main__":
    main()
