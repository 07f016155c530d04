"""The hostile battery: every finding of the two security rounds tried again as a hostile user would, each try a
fresh `headlens` process on tiny (or crafted files), plus the explorer's requests (benchmarks/hostile_explorer.py).

A try holds when: the exit status is non-zero (the memory tries' inputs are valid, only large: they may
succeed); stderr is exactly one line of at most 300 characters, with no traceback and no Rust panic text; nothing
under the work folder changed but the try's named outputs and headlens's cache (a walk of names, types, sizes and
modification times before and after; HOME, holding a file, points into the work folder too); the process's peak
resident memory (os.wait4's ru_maxrss) is at most --limit-mb; and the try's own check (no spreadsheet formula in a
resumed sweep.csv, control characters escaped, a terabyte GGUF refused fast). The repository's `git status` must
be the same at the end. Crafted inputs live in a temporary folder, removed afterwards.

    python benchmarks/hostile_battery.py [--big-mb 100] [--jobs 4] [--only GROUP] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the GGUF writer of tests/test_security_gguf.py, which hostile_files reuses

import hostile_files  # noqa: E402
import hostile_tries  # noqa: E402
from hostile_explorer import run_explorer  # noqa: E402
from hostile_tries import Try  # noqa: E402

TIMEOUT = 900  # seconds a try may run
LONG_LINE = 300


def all_tries(work: Path, env: dict, big: int) -> list[Try]:
    good = work / "good-sweep"  # a finished sweep, copied and damaged by the resume tries
    subprocess.run(
        [
            sys.executable,
            "-m",
            "headlens.cli.main",
            "ablate",
            "tiny",
            "--heads",
            "each",
            "--metric",
            "repeat",
            "--out-dir",
            str(good),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    return [
        *hostile_tries.numbers(),
        *hostile_tries.long_echoes(),
        *hostile_tries.configs(work),
        *hostile_tries.json_readers(work),
        *hostile_tries.labels(work),
        *hostile_tries.resume_rows(work, good),
        *hostile_tries.outputs(work),
        *hostile_tries.train_tiny(work),
        *hostile_files.ggufs(work),
        *hostile_files.tokenizers(work),
        *hostile_files.treebanks(work),
        Try("explorer", "a taken port", ["explore", "tiny", "--port", "{TAKEN}"]),
        *(hostile_files.big_inputs(work, big) if big else []),
    ]


def snapshot(work: Path, skip: set[Path]) -> dict:
    """{relative path: (type, size, mtime)} of everything under `work` but the skipped paths."""
    found = {}
    for folder, dirs, files in os.walk(work):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in dirs + files:
            path = here / name
            if path in skip:
                continue
            info = os.lstat(path)
            found[str(path.relative_to(work))] = (info.st_mode >> 12, info.st_size, info.st_mtime_ns)
    return found


def run_one(argv: list[str], env: dict) -> tuple[int, str, float, float]:
    """(exit status, stderr, peak RSS in MB, wall seconds) of one headlens process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "headlens.cli.main", *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        deadline = time.monotonic() + TIMEOUT
        while not (reaped := os.wait4(child.pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                child.kill()
                reaped = os.wait4(child.pid, 0)
                break
            time.sleep(0.05)
        child.returncode = code = os.waitstatus_to_exitcode(reaped[1])
        err.seek(0)
        text = err.read().decode("utf-8", "backslashreplace")
    return code, text, reaped[2].ru_maxrss / 1024, time.perf_counter() - start


def judge(attempt: Try, code: int, err: str, peak: float, wall: float, work: Path, limit: float) -> str:
    """Why the try did not hold ("" when it held)."""
    lines = err.strip().splitlines()
    if attempt.check == "memory" and code == 0:  # a valid input, only large: its memory is what is tried
        return "" if peak <= limit else f"peak {peak:.0f} MB over {limit:.0f} MB"
    if code == 0:
        return "exit 0: accepted"
    if len(lines) != 1 or len(lines[0]) > LONG_LINE:
        return f"{len(lines)} stderr lines ({max(map(len, lines), default=0)} chars): {err[-200:]!r}"
    if any(word in err for word in ("Traceback", "panicked", "stack backtrace")):
        return f"a traceback or panic: {err[:200]!r}"
    if not peak <= limit:
        return f"peak {peak:.0f} MB over {limit:.0f} MB"
    if attempt.check == "escaped" and any(c in err for c in "\x1b\x07\u202e"):
        return "a control character reached the terminal"
    if attempt.check == "fast" and wall > 60:
        return f"{wall:.0f} s: the file was read before it was refused"
    if attempt.check == "no-formula":
        csv = Path(attempt.outputs[0]) / "sweep.csv"
        if csv.exists() and any(
            cell.startswith(("=", "@", "+")) for cell in csv.read_text().replace("\n", ",").split(",")
        ):
            return "a formula reached sweep.csv"
    return ""


def one_try(attempt: Try, work: Path, env: dict, skip: set[Path], port: str, limit: float) -> dict:
    """Run one try and judge it: its result as a dict (held, why, exit, peak, wall)."""
    argv = [a.replace("{TAKEN}", port) for a in attempt.args]
    before = snapshot(work, skip)
    code, err, peak, wall = run_one(argv, {**env, **attempt.env})
    why = judge(attempt, code, err, peak, wall, work, limit)
    changed = sorted(set(before.items()) ^ set(snapshot(work, skip).items()))
    why = why or (f"changed {changed[0][0]}" if changed else "")
    return {
        "group": attempt.group,
        "name": attempt.name,
        "held": not why,
        "why": why,
        "exit": code,
        "peak_mb": round(peak),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-mb", type=float, default=100, help="size of the memory tries' inputs (0: none)")
    parser.add_argument("--limit-mb", type=float, default=1500, help="peak resident memory a try may reach")
    parser.add_argument("--only", help="run only this group (numbers, echo, config.json, json, labels, ...)")
    parser.add_argument("--json", help="write every try's result to this file")
    parser.add_argument("--jobs", type=int, default=1, help="tries run at once (each in its own process)")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headlens-battery-"))
    env = {
        **os.environ,
        "HOME": str(work / "home"),
        "HEADLENS_CACHE": str(work / "cache"),
        "OLLAMA_MODELS": str(work / "store"),
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    env.pop("HEADLENS_DEBUG", None)
    (work / "home").mkdir()
    (work / "home" / ".profile").write_text("# a home folder holds files\n")
    (work / "sentinel").mkdir()
    (work / "sentinel" / "keep.txt").write_text("headlens must never remove this\n")
    git_before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    results = []
    try:
        tries = [t for t in all_tries(work, env, int(options.big_mb * 1e6)) if options.only in (None, t.group)]
        skip = {work / "cache"} | {Path(p) for t in tries for p in t.outputs}
        with socket.socket() as taken:  # a port in use, for the explorer's taken-port try
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = str(taken.getsockname()[1])
            with ThreadPoolExecutor(options.jobs) as pool:
                for result in pool.map(lambda t: one_try(t, work, env, skip, port, options.limit_mb), tries):
                    results.append(result)
                    show(result)
        if options.only in (None, "explorer"):
            for name, held, why in run_explorer(env, options.limit_mb):
                results.append({"group": "explorer", "name": name, "held": held, "why": "" if held else why})
                show(results[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    git_after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    results.append({"group": "repository", "name": "git status unchanged", "held": git_before == git_after, "why": ""})
    summary(results)
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))


def show(result: dict) -> None:
    mark = "held  " if result["held"] else "FAILED"
    figures = (
        f"exit {result['exit']:3d} {result['peak_mb']:6d} MB {result['wall_s']:6.1f} s" if "exit" in result else ""
    )
    print(f"{mark} {result['group']:11s} {result['name'][:60]:60s} {figures} {result['why'][:160]}", flush=True)


def summary(results: list[dict]) -> None:
    held = sum(r["held"] for r in results)
    groups, failed = Counter(r["group"] for r in results), Counter(r["group"] for r in results if not r["held"])
    print(f"\n{held} of {len(results)} held")
    for group, count in groups.items():
        print(f"  {group:11s} {count - failed[group]:3d} of {count:3d}")
    peaks = [r["peak_mb"] for r in results if "peak_mb" in r]
    print(f"  largest peak RSS of a try: {max(peaks, default=0)} MB")


if __name__ == "__main__":
    main()
