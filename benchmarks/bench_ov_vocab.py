"""Copy suppression's OV criterion over the vocabulary (`cs_ov_vocab`) alone: wall and CPU seconds, and
every field compared with another checkout's run.

The script imports headlens from the interpreter's own installation, so the same file times two
checkouts when run by each one's virtualenv, alternating:

    OLD/.venv/bin/python benchmarks/bench_ov_vocab.py smollm2 --save /tmp/old.pt
    .venv/bin/python benchmarks/bench_ov_vocab.py smollm2 --save /tmp/new.pt --compare /tmp/old.pt

`--compare FILE` prints, per field (cs_ov_score, n, ci_low, ci_high, se), how many heads differ (NaN on
both sides counts as equal) and the first of them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from headlens.load.models import load_model
from headlens.scores.ov_vocab import cs_ov_vocab


def differing(old: dict, new: dict) -> dict[str, list[tuple[int, int]]]:
    """field -> the (layer, head) pairs whose values differ between two saved results."""
    out = {}
    for name, before in old.items():
        after = new[name]
        same = (before == after) | (before.isnan() & after.isnan())  # [layer, head]
        out[name] = [tuple(pair) for pair in (~same).nonzero().tolist()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--save", type=Path, help="keep the result's tensors here (torch.save)")
    parser.add_argument("--compare", type=Path, help="a --save file of another run to compare with")
    args = parser.parse_args()
    model = load_model(args.model).model
    load = Path("/proc/loadavg").read_text().split()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    result = cs_ov_vocab(model)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    past = int((result["n"] > result["screen"]).sum())
    print(f"{args.model}: {wall:.1f} s wall, {cpu:.1f} CPU s, load {load}; {past} heads past the screen")
    tensors = {name: value for name, value in result.items() if isinstance(value, torch.Tensor)}
    if args.save:
        torch.save(tensors, args.save)
    if args.compare:
        for name, pairs in differing(torch.load(args.compare, weights_only=True), tensors).items():
            print(f"{name}: {len(pairs)} heads differ{f', first {pairs[0]}' if pairs else ''}")


if __name__ == "__main__":
    main()
