"""Composition for all pairs: an earlier revision of headlens/circuits/composition.py beside this one,
in one run, on one model (same weights, same load), with the largest score difference between them.

    .venv/bin/python benchmarks/bench_composition.py smollm2 [--old-rev 1582192] [--repeats 2]

Each version runs `repeats` times alternately (old, new, old, new, ...); the best time of each is
reported, with the machine's load average (os.getloadavg) before and after and torch's thread count.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from headlens.circuits import composition as new_composition
from headlens.load.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def old_module(rev: str):
    """headlens/circuits/composition.py as it was at `rev`, imported under another name."""
    text = subprocess.run(
        ["git", "show", f"{rev}:headlens/circuits/composition.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "composition_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("composition_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--old-rev", default="1582192")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    loaded = load_model(args.model)
    versions = {"old": old_module(args.old_rev), "new": new_composition}
    times: dict[str, list[float]] = {"old": [], "new": []}
    frames = {}
    figures: dict = {"model": args.model, "threads": torch.get_num_threads(), "load_before": os.getloadavg()}
    for _ in range(args.repeats):
        for name, module in versions.items():
            if hasattr(module.random_baseline, "cache_clear"):
                module.random_baseline.cache_clear()  # time the baseline every run, as the old version does
            start = time.perf_counter()
            result = module.composition_scores(loaded)
            frames[name] = getattr(result, "frame", result)  # a revision before headlens.Result returns the frame
            times[name].append(time.perf_counter() - start)
    figures["load_after"] = os.getloadavg()
    figures["old_s"], figures["new_s"] = times["old"], times["new"]
    figures["ratio_best"] = min(times["old"]) / min(times["new"])
    old, new = frames["old"], frames["new"]
    figures["edges"] = len(new)
    figures["max_abs_score_diff"] = float((old["composition"] - new["composition"]).abs().max())
    for name, frame in (("old", old), ("new", new)):
        figures[f"baseline_{name}"] = [
            float(frame["composition_baseline"].iloc[0]),
            float(frame["composition_baseline_std"].iloc[0]),
        ]
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    sys.exit(main())
