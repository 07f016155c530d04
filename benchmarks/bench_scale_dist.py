"""The 144-head exact sweep in one process or spread over ranks: same deltas, wall-time ratio.

  one   1 process x 2 threads: `sweep_heads` on a GPT-2-small-shaped model (random weights, seed 0),
        metric `repeat` (16 sequences of BOS + 2 x 25 random tokens; the loss on the second copy)
  dist  `torchrun --standalone --nproc-per-node 2`, 1 thread per rank, gloo: the same call; each rank
        ablates every other pending head, rows gathered on every rank
  one1  1 process x 1 thread: the reference for exactness (a thread count changes the order of BLAS
        reductions, so 2 threads differ from 1 in the last float bits; each rank runs 1 thread)
Each mode runs in a fresh process tree; the time is the sweep call alone (model built and a
barrier passed first), taken on rank 0. The sharded table must equal the 1-thread one exactly
(check_exact); its largest difference from the 2-thread table is printed.

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
    from headlens.load.models import build_model

    distributed.init()
    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    loaded = build_model(None, seed=0, name="gpt2-shaped-random")
    distributed.barrier()
    start = time.perf_counter()
    frame = sweep_heads(loaded, metric="repeat").frame
    seconds = time.perf_counter() - start
    if distributed.is_main():
        frame.to_pickle(out / "sweep.pkl")
        (out / "seconds.json").write_text(json.dumps({"seconds": seconds, "world": distributed.world_size()}))


def _run(mode: str, out: Path) -> dict:
    out.mkdir(parents=True)
    if mode in ("one", "one1"):
        command, threads = [sys.executable, __file__, "--worker", str(out)], "2" if mode == "one" else "1"
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            __file__,
            "--worker",
            str(out),
        ]
        threads = "1"
    env = {**os.environ, "BENCH_THREADS": threads, "OMP_NUM_THREADS": threads}
    subprocess.run(command, check=True, env=env)
    return json.loads((out / "seconds.json").read_text())


def main() -> None:
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: _run(mode, Path(tmp) / mode) for mode in ("one", "dist", "one1")}
        tables = {mode: pd.read_pickle(Path(tmp) / mode / "sweep.pkl") for mode in runs}
    pd.testing.assert_frame_equal(tables["dist"], tables["one1"], check_exact=True)
    numeric = tables["one"].select_dtypes("number").columns
    spread = (tables["dist"][numeric] - tables["one"][numeric]).abs().max().max()
    one, dist, one1 = runs["one"]["seconds"], runs["dist"]["seconds"], runs["one1"]["seconds"]
    print(
        f"144-head sweep, metric repeat: 1 process x 2 threads {one:.1f} s; 2 ranks x 1 thread {dist:.1f} s; "
        f"1 process x 1 thread {one1:.1f} s; ratio 2 ranks / 2 threads {dist / one:.2f}; "
        f"2 ranks equal 1 thread exactly; largest difference from 2 threads {spread:.2e}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]))
    else:
        main()
