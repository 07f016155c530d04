"""Peak memory of `headlens classify tiny --text FILE` against the size of a plain text file.

Writes text files of the given sizes (MB, 10^6 bytes) into --dir (default: a temporary folder under
/tmp, removed afterwards; never the repository), each the shipped held-out text repeated, then runs the
command once per file in a fresh process and reads that process's peak resident memory (ru_maxrss from
os.wait4). A text file is read in pieces (headlens.probes.corpus.TextFile), so the peak should not grow with the
file. `--root DIR` runs the headlens found in DIR instead (e.g. a checkout of older code, to compare).

    python benchmarks/bench_text_memory.py --sizes 4 40 400
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "headlens" / "data" / "tiny" / "heldout.txt"


def write_text(path: Path, megabytes: float) -> Path:
    """`path` filled with the held-out text repeated up to `megabytes` x 10^6 bytes (cut at a line end)."""
    block = HELDOUT.read_bytes()
    target = int(megabytes * 1e6)
    with open(path, "wb") as handle:
        written = 0
        while written + len(block) <= target:
            handle.write(block)
            written += len(block)
        rest = block[: target - written]
        handle.write(rest[: rest.rfind(b"\n") + 1])
    return path


def peak_run(text: Path, root: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, wall seconds, exit status) of one classify run in a fresh process."""
    argv = [sys.executable, "-m", "headlens.cli.main", "classify", "tiny", "--text", str(text), "--no-progress"]
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    err = child.stderr.read().decode("utf-8", "replace").strip().splitlines() if child.stderr else []
    child.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"  exit {code}: {err[-1] if err else ''}")
    return usage.ru_maxrss / 1024, wall, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4, 40, 400], help="file sizes in MB")
    parser.add_argument("--dir", type=Path, default=None, help="where the text files go [default: a /tmp folder]")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose headlens runs")
    args = parser.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="headlens-bench-text-", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"load {os.getloadavg()[0]:.1f}; root {args.root}")
    print("| file | peak RSS | wall | exit |")
    print("|---|---|---|---|")
    peaks = []
    try:
        for size in args.sizes:
            text = write_text(folder / f"text-{size:g}MB.txt", size)
            peak, wall, code = peak_run(text, args.root)
            peaks.append(peak)
            print(f"| {size:g} MB | {peak:.0f} MB | {wall:.1f} s | {code} |", flush=True)
            text.unlink()
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"peak growth from {args.sizes[0]:g} to {args.sizes[-1]:g} MB of text: {peaks[-1] - peaks[0]:+.0f} MB")


if __name__ == "__main__":
    main()
