"""OV copying scores (headlens.scores.ov_copying) through the shared W_U N(E) g_0 product vs the
per-layer vocabulary pass it replaces (the fallback route), side by side in one process: CPU and
wall seconds of each and the largest score difference.

    .venv/bin/python benchmarks/bench_ov_copying.py smollm2 [gemma3-270m ...]
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

import torch

from headlens.arch import adapter_for
from headlens.load.models import load_model
from headlens.scores import ov_copying


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    for name in args.names:
        model = load_model(name).model
        adapter = adapter_for(model)
        with torch.no_grad():
            shared = ov_copying._shared_read(adapter, ov_copying.folded_unembed(adapter)) is not None
        wall, cpu, fast = timed(lambda model=model: ov_copying.ov_copying_scores(model))
        with mock.patch.object(ov_copying, "_shared_read", lambda *a: None):
            wall_v, cpu_v, slow = timed(lambda model=model: ov_copying.ov_copying_scores(model))
        diff = float((fast - slow).abs().max())
        print(
            f"{name}: shared product taken {shared}; shared {wall:.1f} s wall {cpu:.1f} CPU s; "
            f"per-layer vocabulary {wall_v:.1f} s wall {cpu_v:.1f} CPU s; max |diff| {diff:.2e}"
        )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
