"""The mission's commands end to end, two checkouts side by side in one sitting.

Each command runs as its own process, once per checkout and round, alternating old and new so that
both see the same machine; wall seconds, CPU seconds (user + system of the child) and peak memory
come from the process itself (`os.wait4`), the load average from /proc/loadavg. A markdown
table and one JSON line per run are printed; `--json FILE` also keeps the lines.

    python benchmarks/bench_commands.py --old /path/to/old/.venv/bin --new .venv/bin \
        --only ablate-first ablate-cached --rounds 1

Commands (`--only` picks some, by name):
- start: imports + `load_model("smollm2")`, the time before the first forward;
- ablate-first: `ablate smollm2 --heads 3.4,5.1` with the clean-run cache off (HEADLENS_NO_CLEAN_CACHE);
- ablate-cached: the same with the clean run cached (a warm-up run fills the cache first);
- ablate-induction: `ablate smollm2 --heads induction --control random:20` (the classification the role
  needs is cached by a warm-up run);
- classify-smollm2, classify-gemma: `classify MODEL --format csv --out-dir DIR` with copy suppression's vocabulary
  criteria computed (HEADLENS_NO_VOCAB_CACHE); classify-smollm2-cached, classify-gemma-cached: the same with
  them cached by a warm-up run (headlens.classify.vocab_cache);
- report: `report smollm2 --out FILE` as `make demo` runs it on a fresh machine (the pull of an already pulled
  model left out): the vocabulary criteria and the clean runs computed, not read from headlens's cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = (
    "import time; t0 = time.perf_counter(); import headlens.cli.main; from headlens.load.models import load_model; "
    "load_model('smollm2'); print(f'start {time.perf_counter() - t0:.2f}')"
)
# name -> (argv after the bin folder, extra environment, whether a warm-up run goes first)
COMMANDS: dict[str, tuple[list[str], dict[str, str], bool]] = {
    "start": (["python", "-c", START], {}, True),
    "ablate-first": (
        ["headlens", "ablate", "smollm2", "--heads", "3.4,5.1", "--no-progress"],
        {"HEADLENS_NO_CLEAN_CACHE": "1"},
        False,
    ),
    "ablate-cached": (["headlens", "ablate", "smollm2", "--heads", "3.4,5.1", "--no-progress"], {}, True),
    "ablate-induction": (
        ["headlens", "ablate", "smollm2", "--heads", "induction", "--control", "random:20", "--no-progress"],
        {},
        True,
    ),
    **{
        f"classify-{short}{'-cached' if cached else ''}": (
            ["headlens", "classify", model, "--no-progress", "--format", "csv", "--out-dir", "{out}"],
            {} if cached else {"HEADLENS_NO_VOCAB_CACHE": "1"},  # first run: the vocabulary criteria computed
            cached,  # cached: a warm-up run fills headlens.classify.vocab_cache
        )
        for short, model in (("smollm2", "smollm2"), ("gemma", "gemma3-270m"))
        for cached in (False, True)
    },
    "report": (
        ["headlens", "report", "smollm2", "--no-progress", "--out", "{out}/report.html"],
        {"HEADLENS_NO_VOCAB_CACHE": "1", "HEADLENS_NO_CLEAN_CACHE": "1"},  # a fresh machine's first report
        False,
    ),
}


def run_once(bin_dir: Path, name: str, out: Path) -> dict:
    """One run of command `name` from the checkout whose virtualenv bin folder is `bin_dir`, writing
    into a new folder under `out`."""
    argv, extra, _ = COMMANDS[name]
    out = Path(tempfile.mkdtemp(dir=out))  # this run's own output folder
    argv = [str(bin_dir / argv[0]), *(a.replace("{out}", str(out)) for a in argv[1:])]
    env = {**os.environ, **extra}
    load = float(Path("/proc/loadavg").read_text().split()[0])
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own resource use
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read().strip().splitlines()[-3:]
    return {
        "command": name,
        "checkout": str(bin_dir),
        "rc": child.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_mb": round(usage.ru_maxrss / 1024),  # Linux: KiB
        "load": load,
        "out": str(out),
        "report_bytes": (out / "report.html").stat().st_size if (out / "report.html").exists() else None,
        "tail": tail,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="bin folder of the old checkout's virtualenv")
    parser.add_argument("--new", type=Path, default=Path(".venv/bin"), help="bin folder of the new checkout's")
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also append one JSON line per run here")
    parser.add_argument("--keep", type=Path, help="keep the runs' outputs in this folder")
    args = parser.parse_args(argv)
    checkouts = [b for b in (args.old, args.new) if b is not None]
    rows = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = str(args.keep or tmp)
        for name in args.only:
            for bin_dir in checkouts:
                if COMMANDS[name][2]:
                    run_once(bin_dir, name, Path(tmp))  # warm-up: fills the caches the command reuses
            for _ in range(args.rounds):
                for bin_dir in checkouts:
                    row = run_once(bin_dir, name, Path(tmp))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.json:
                        with args.json.open("a", encoding="utf-8") as fh:
                            fh.write(json.dumps(row) + "\n")
    print("\n| command | checkout | wall s | CPU s | peak MB | load | rc |\n|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r[k] for k in ("command", "checkout", "wall_s", "cpu_s", "peak_mb", "load", "rc")]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
