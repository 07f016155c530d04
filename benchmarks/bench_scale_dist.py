"""The 144-head exact sweep in one process or spread over ranks: same deltas, wall-time ratio.

  one   1 process x 2 threads: `sweep_heads` on a GPT-2-small-shaped model (random weights, seed 0),
        metric `repeat` (16 sequences of BOS + 2 x 25 random tokens; the loss on the second copy)
  dist  `torchrun --standalone --nproc-per-node 2`, 1 thread per rank, gloo: the same call; each rank
        ablates every other pending head, rows gathered on every rank
Each mode runs in a fresh process tree; the time is the sweep call alone (model built and a
barrier passed first), taken on rank 0. The two tables must be identical (check_exact).

    .venv/bin/python benchmarks/bench_scale_dist.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _worker(out: Path) -> None:
    from headlens import distributed
    from headlens.ablation import sweep_heads
    from headlens.models import build_model

    distributed.init()
    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    loaded = build_model(None, seed=0, name="gpt2-shaped-random")
    distributed.barrier()
    start = time.perf_counter()
    frame = sweep_heads(loaded, metric="repeat")
    seconds = time.perf_counter() - start
    if distributed.is_main():
        frame.to_pickle(out / "sweep.pkl")
        (out / "seconds.json").write_text(json.dumps({"seconds": seconds, "world": distributed.world_size()}))


def _run(mode: str, out: Path) -> dict:
    out.mkdir(parents=True)
    if mode == "one":
        command, threads = [sys.executable, __file__, "--worker", str(out)], "2"
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
                   "--worker", str(out)]
        threads = "1"
    env = {**os.environ, "BENCH_THREADS": threads, "OMP_NUM_THREADS": threads}
    subprocess.run(command, check=True, env=env)
    return json.loads((out / "seconds.json").read_text())


def main() -> None:
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        one = _run("one", Path(tmp) / "one")
        dist = _run("dist", Path(tmp) / "dist")
        a, b = pd.read_pickle(Path(tmp) / "one" / "sweep.pkl"), pd.read_pickle(Path(tmp) / "dist" / "sweep.pkl")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    print(f"144-head sweep, metric repeat: 1 process x 2 threads {one['seconds']:.1f} s; "
          f"2 ranks x 1 thread {dist['seconds']:.1f} s; ratio {dist['seconds'] / one['seconds']:.2f}; "
          "tables identical (check_exact)")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]))
    else:
        main()
