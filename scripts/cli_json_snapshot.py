"""Byte-for-byte guard on the CLI's output: run a fixed set of `headlens` commands on the shipped `tiny`
model (fixed --seed, --no-progress, mostly --format json) and store each one's stdout, stderr and exit
status under OUT_DIR, one file per command. Run it before and after a change to cli/ and compare:

    .venv/bin/python scripts/cli_json_snapshot.py /tmp/cli-before
    ... change ...
    .venv/bin/python scripts/cli_json_snapshot.py /tmp/cli-after
    diff -r /tmp/cli-before /tmp/cli-after

The files the commands write (under FILES) are copied to OUT_DIR/files, but the HTML pages.
The bad-input cases pin the one-line errors and exit status 2 of the checks on combinations of flags.
Nothing the commands print depends on timing, except where TIMED names a key, which is blanked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HEADS = "0.1,1.2"  # tiny: 2 layers x 4 heads
# where the commands that write files write them: one fixed path, so the "wrote PATH" lines compare across runs
FILES = "/tmp/headlens-cli-snapshot"
COMMON = ["--no-progress", "--seed", "0"]

# name -> the arguments after `headlens`
COMMANDS: dict[str, list[str]] = {
    "classify": ["classify", "tiny", "--format", "json", *COMMON],
    "ablate_heads": ["ablate", "tiny", "--heads", HEADS, "--format", "json", *COMMON],
    "ablate_heads_table": ["ablate", "tiny", "--heads", HEADS, *COMMON],
    "ablate_mean": ["ablate", "tiny", "--heads", HEADS, "--method", "mean", "--format", "json", *COMMON],
    "ablate_resample_repeat": [
        "ablate",
        "tiny",
        "--heads",
        HEADS,
        "--method",
        "resample",
        "--metric",
        "repeat",
        "--format",
        "json",
        *COMMON,
    ],
    "ablate_layer_control": [
        "ablate",
        "tiny",
        "--heads",
        "layer:1",
        "--control",
        "random:5",
        "--tokens",
        "512",
        "--format",
        "json",
        *COMMON,
    ],
    "ablate_role": ["ablate", "tiny", "--heads", "induction", "--tokens", "512", "--format", "json", *COMMON],
    "ablate_each": ["ablate", "tiny", "--heads", "each", "--tokens", "256", "--format", "json", *COMMON],
    "ablate_each_table": ["ablate", "tiny", "--heads", "each", "--tokens", "256", *COMMON],
    "ablate_approx": ["ablate", "tiny", "--heads", "each", "--approx", "--format", "json", *COMMON],
    "ablate_approx_check": ["ablate", "tiny", "--heads", "each", "--approx", "--check", "--format", "json", *COMMON],
    "prune": ["prune", "tiny", "--tokens", "1024", "--format", "json", *COMMON],
    "circuit": ["circuit", "tiny", "--format", "json", *COMMON],
    "circuit_ablate": ["circuit", "tiny", "--ablate", HEADS, "--format", "json", *COMMON],
    "circuit_table": ["circuit", "tiny", *COMMON],
    "circuit_backups": ["circuit", "tiny", "--backups", "--control", "random:3", "--format", "json", *COMMON],
    "circuit_backups_table": ["circuit", "tiny", "--backups", "--control", "random:3", *COMMON],
    "circuit_report": ["circuit", "tiny", "--report", f"{FILES}/circuit.html", *COMMON],
    "circuit_out_json": ["circuit", "tiny", "--out", f"{FILES}/circuit.json", *COMMON],
    "discover": ["circuit", "tiny", "--discover", "--edges", "30", "--format", "json", *COMMON],
    "discover_table": ["circuit", "tiny", "--discover", "--no-stability", *COMMON],  # the default method, eap-ig
    "discover_eap": ["circuit", "tiny", "--discover", "--method", "eap", "--no-stability", *COMMON],
    "discover_backups": [
        "circuit",
        "tiny",
        "--discover",
        "--no-stability",
        "--backups",
        "--control",
        "random:3",
        *COMMON,
    ],  # fmt: skip
    "discover_report": [
        "circuit",
        "tiny",
        "--discover",
        "--no-stability",
        "--report",
        f"{FILES}/discover.html",
        "--graph-out",
        f"{FILES}/graph.json",
        "--format",
        "json",
        *COMMON,
    ],  # fmt: skip
    "discover_file": ["circuit", "tiny", "--circuit", f"{FILES}/graph.json", "--format", "json", *COMMON],
    "classify_table": ["classify", "tiny", *COMMON],
    "classify_report": ["classify", "tiny", "--report", f"{FILES}/classify.html", *COMMON],
    "classify_out_csv": ["classify", "tiny", "--out", f"{FILES}/heads.csv", *COMMON],
    "classify_out_dir": ["classify", "tiny", "--out-dir", f"{FILES}/out", "--format", "csv", *COMMON],
    "validate": ["validate", "tiny", "--format", "json"],
    "heads": ["heads", HEADS, "tiny"],
    # bad input: one line on stderr, exit 2
    "bad_heads_spec": ["ablate", "tiny", "--heads", "0.x", *COMMON],
    "bad_check_without_approx": ["ablate", "tiny", "--heads", HEADS, "--check", *COMMON],
    "bad_resume_without_out_dir": ["ablate", "tiny", "--heads", "each", "--resume", *COMMON],
    "bad_approx_batch": ["ablate", "tiny", "--heads", "each", "--approx", "--batch-size", "2", *COMMON],
    "bad_approx_tokens": ["ablate", "tiny", "--heads", "each", "--approx", "--tokens", "100", *COMMON],
    "bad_method": ["ablate", "tiny", "--heads", HEADS, "--method", "nope", *COMMON],
    "bad_metric": ["ablate", "tiny", "--heads", HEADS, "--metric", "nope", *COMMON],
    "bad_control": ["ablate", "tiny", "--heads", HEADS, "--control", "random:x", *COMMON],
    "bad_tokens": ["ablate", "tiny", "--heads", HEADS, "--tokens", "-3", *COMMON],
    "bad_batch": ["ablate", "tiny", "--heads", HEADS, "--batch-size", "0", *COMMON],
    "bad_prune_tokens": ["prune", "tiny", "--tokens", "zero", *COMMON],
    "bad_format": ["ablate", "tiny", "--heads", HEADS, "--format", "csv", *COMMON],
    "bad_two_models": ["ablate", "tiny", "--model", "tiny-gqa", "--heads", HEADS, *COMMON],
    "bad_circuit_method": ["circuit", "tiny", "--method", "nope", *COMMON],
    "bad_circuit_approx": ["circuit", "tiny", "--approx", "nope", *COMMON],
    "bad_circuit_control": ["circuit", "tiny", "--backups", "--control", "random:x", *COMMON],
    "bad_circuit_report": ["circuit", "tiny", "--report", f"{FILES}/circuit.txt", *COMMON],
    "bad_discover_method": ["circuit", "tiny", "--discover", "--method", "nope", *COMMON],
    "bad_discover_report": ["circuit", "tiny", "--discover", "--report", f"{FILES}/discover.txt", *COMMON],
    "bad_discover_file": ["circuit", "tiny", "--circuit", f"{FILES}/missing.json", *COMMON],
    "bad_classify_seq_len": ["classify", "tiny", "--seq-len", "3", *COMMON],
    "bad_classify_threshold": ["classify", "tiny", "--threshold", "induction=7", *COMMON],
    "bad_classify_paths": ["classify", "tiny", "a.txt", *COMMON],
    "bad_classify_report": ["classify", "tiny", "--report", f"{FILES}/classify.txt", *COMMON],
}
TIMED: tuple[str, ...] = ()  # JSON keys whose values depend on timing (none today)


def blank_timed(text: str) -> str:
    """`text` with the TIMED keys of a JSON document blanked; anything else unchanged."""
    if not TIMED:
        return text
    try:
        document = json.loads(text)
    except ValueError:
        return text
    for key in TIMED:
        if isinstance(document, dict) and key in document:
            document[key] = "<timed>"
    return json.dumps(document) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--headlens", default=str(Path(sys.executable).parent / "headlens"))
    parser.add_argument("--only", nargs="*", default=None, help="names of COMMANDS to run")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(FILES, ignore_errors=True)
    Path(FILES).mkdir(parents=True)
    env = {**os.environ, "COLUMNS": "200", "HEADLENS_DEBUG": "0"}
    for name, argv in COMMANDS.items():
        if args.only and name not in args.only:
            continue
        done = subprocess.run([args.headlens, *argv], capture_output=True, text=True, env=env, check=False)
        (args.out_dir / f"{name}.stdout").write_text(blank_timed(done.stdout))
        (args.out_dir / f"{name}.stderr").write_text(done.stderr)
        (args.out_dir / f"{name}.rc").write_text(f"{done.returncode}\n")
        print(f"{name}: exit {done.returncode}, {len(done.stdout)} bytes", flush=True)
    for path in sorted(Path(FILES).rglob("*")):  # the files written, but the HTML pages (they carry a date)
        if path.is_file() and path.suffix != ".html":
            target = args.out_dir / "files" / path.relative_to(FILES)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())


if __name__ == "__main__":
    main()
