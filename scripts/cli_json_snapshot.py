"""Byte-for-byte guard on the CLI's output: run a fixed set of `headlens` commands on the shipped `tiny`
model (fixed --seed, --no-progress, mostly --format json) and store each one's stdout, stderr and exit
status under OUT_DIR, one file per command. Run it before and after a change to cli/ and compare:

    .venv/bin/python scripts/cli_json_snapshot.py /tmp/cli-before
    ... change ...
    .venv/bin/python scripts/cli_json_snapshot.py /tmp/cli-after
    diff -r /tmp/cli-before /tmp/cli-after

The bad-input cases pin the one-line errors and exit status 2 of the checks on combinations of flags.
Nothing the commands print depends on timing, except where TIMED names a key, which is blanked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HEADS = "0.1,1.2"  # tiny: 2 layers x 4 heads
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
    env = {**os.environ, "COLUMNS": "200", "HEADLENS_DEBUG": "0"}
    for name, argv in COMMANDS.items():
        if args.only and name not in args.only:
            continue
        done = subprocess.run([args.headlens, *argv], capture_output=True, text=True, env=env, check=False)
        (args.out_dir / f"{name}.stdout").write_text(blank_timed(done.stdout))
        (args.out_dir / f"{name}.stderr").write_text(done.stderr)
        (args.out_dir / f"{name}.rc").write_text(f"{done.returncode}\n")
        print(f"{name}: exit {done.returncode}, {len(done.stdout)} bytes", flush=True)


if __name__ == "__main__":
    main()
