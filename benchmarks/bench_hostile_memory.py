"""Peak memory of headlens on hostile inputs of a given size: a text of one line (no line end to cut at) for
`validate` and `ablate`, the same text as one JSON line for `classify`, a GGUF whose metadata holds one huge
array, and a heads.json of that size for `ablate --labels`.

Each input is written into a temporary folder under /tmp (removed afterwards; never the repository), each
command runs once in a fresh process, and that process's peak resident memory is read from os.wait4
(ru_maxrss). The exit status is shown: a refused input (exit 2) is a pass as long as its peak is bounded.

    python benchmarks/bench_hostile_memory.py --sizes 50 100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = b"the quick brown fox jumps over the lazy dog and then some more words follow "


def one_line_text(path: Path, size: int) -> Path:
    block = WORDS * (1 << 14)
    with open(path, "wb") as handle:
        for _ in range(size // len(block)):
            handle.write(block)
    return path


def one_line_jsonl(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.write(b'{"text": "')
        block = WORDS * (1 << 14)
        for _ in range(size // len(block)):
            handle.write(block)
        handle.write(b'"}\n')
    return path


def huge_array_gguf(path: Path, size: int) -> Path:
    """A small llama header whose metadata holds one uint8 array of `size` items under an unused key."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    kv = [("general.architecture", 8, string("llama"))]
    kv += [(f"llama.{k}", 4, struct.pack("<I", v)) for k, v in (("block_count", 2), ("embedding_length", 64))]
    kv += [("llama.attention.head_count", 4, struct.pack("<I", 4))]
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv) + 1))
        for key, kind, value in kv:
            handle.write(string(key) + struct.pack("<I", kind) + value)
        handle.write(string("general.junk") + struct.pack("<IIQ", 9, 0, size))
        block = b"\x01" * (1 << 20)
        for _ in range(size // len(block)):
            handle.write(block)
        handle.write(b"\x01" * (size % len(block)))
    return path


def big_labels(path: Path, size: int) -> Path:
    record = json.dumps({"layer": 0, "head": 0, "labels": ["induction"], "score": 0.5}).encode()
    with open(path, "wb") as handle:
        handle.write(b"[")
        for _ in range(size // (len(record) + 1)):
            handle.write(record + b",")
        handle.write(record + b"]")
    return path


def peak_run(args: list[str]) -> tuple[float, float, int, str]:
    """(peak RSS in MB, wall seconds, exit status, last stderr line) of one headlens run in a fresh process."""
    argv = [sys.executable, "-m", "headlens.cli.main", *args]
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = child.stderr.read().decode("utf-8", "replace").strip().splitlines() if child.stderr else []
    _, status, usage = os.wait4(child.pid, 0)
    child.stderr.close()
    return (
        usage.ru_maxrss / 1024,
        time.perf_counter() - start,
        os.waitstatus_to_exitcode(status),
        err[-1] if err else "",
    )


def runs(folder: Path, size: int) -> list[tuple[str, list[str]]]:
    text, jsonl = one_line_text(folder / "one.txt", size), one_line_jsonl(folder / "one.jsonl", size)
    gguf, labels = huge_array_gguf(folder / "array.gguf", size), big_labels(folder / "heads.json", size)
    return [
        ("validate tiny --text one-line.txt", ["validate", "tiny", "--text", str(text)]),
        ("ablate tiny --heads 0.0 --text one-line.txt", ["ablate", "tiny", "--heads", "0.0", "--text", str(text)]),
        ("classify tiny --text one-line.jsonl", ["classify", "tiny", "--text", str(jsonl), "--no-progress"]),
        ("heads 0.0 array.gguf (one array of N items)", ["heads", "0.0", str(gguf)]),
        (
            "ablate tiny --heads induction --labels heads.json",
            ["ablate", "tiny", "--heads", "induction", "--labels", str(labels)],
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[50, 100], help="input sizes in MB (10^6 bytes)")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="headlens-hostile-"))
    os.environ["HEADLENS_CACHE"] = str(folder / "cache")
    try:
        for megabytes in options.sizes:
            for name, args in runs(folder, int(megabytes * 1e6)):
                peak, wall, code, line = peak_run(args)
                note = f"  ({line[:90]})" if code else ""
                print(
                    f"{megabytes:6.0f} MB  {name:52s} peak {peak:7.0f} MB  {wall:6.1f} s  exit {code}{note}", flush=True
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
