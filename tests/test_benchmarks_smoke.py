"""Smoke runs of the benchmark scripts: each script as a subprocess at the smallest sizes it accepts, on the
shipped tiny model or random weights (never the pulled real models), checked for exit status 0 and for a
result line it prints (a table row or a figure), not only for the absence of a crash.

The scripts in HEAVY take minutes even at their smallest sizes: they are not part of the suite (conftest.py
deselects the `bench_heavy` mark) and run with `make bench-smoke-all` (pytest's --bench-heavy).
Not run at all, each for a stated reason:
  peak_memory.py, tl_loop.py   helper modules imported by the other scripts, not runnable on their own
  bench_load.py                its names are restricted to the pulled real GGUF models (smollm2, gemma3-270m)
  sweep_recipes.py             starts 17 concurrent training processes; an exploration tool for a GPU machine
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
TIMEOUT_S = 600  # per script, on 2 loaded cores
NUMBER = r"-?[\d.]+(?:e[-+]?\d+)?"


def run_script(argv: list[str], env: dict | None = None) -> str:
    """Run argv from the repository root; assert exit status 0; return stdout."""
    done = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def assert_prints(stdout: str, pattern: str) -> re.Match:
    found = re.search(pattern, stdout, re.MULTILINE)
    assert found, f"no line matching {pattern!r} in:\n{stdout[-3000:]}"
    return found


# (script, arguments, a line its result prints). "{tmp}" is the test's tmp_path, "{small}" a saved 2-layer x
# 4-head random GPT-2 (the GPT-2 tokenizer: the IOI names are single tokens, which the byte-level tiny lacks).
CASES = [
    ("bench_report.py", [], rf"^total {NUMBER} MB$"),
    (
        "bench_real.py",
        ["attribution", "--model", "tiny", "--metrics", "repeat", "--repeat-seqs", "2", "--repeat-len", "6"]
        + ["--replacements", "zero,patch", "--step", "0.01", "--no-graddrop"],
        rf"^  first order: .* ranks the full effect at Spearman {NUMBER}, .* Spearman {NUMBER} / {NUMBER}$",
    ),
    ("bench_train.py", ["--steps", "1"], rf"^\| tiny recipe \(gpt2\): training step, 1 thread\(s\).* {NUMBER} ms"),
    ("bench_ov_copying.py", ["tiny"], rf"^tiny: shared product taken True;.* max \|diff\| {NUMBER}$"),
    ("bench_cs_qk.py", ["tiny"], rf"^tiny: cs_qk_vocab {NUMBER} s wall, {NUMBER} CPU s; d_vocab \d+"),
    ("bench_ov_vocab.py", ["tiny", "--save", "{tmp}/ov.pt"], rf"^tiny: {NUMBER} s wall, {NUMBER} CPU s, load"),
    ("bench_digest.py", ["tiny"], rf"^tiny: load {NUMBER} s; digest {NUMBER}-{NUMBER} s over 3 \(462,464 params\)$"),
    ("bench_rank_scan.py", ["tiny"], rf"^  QK, queries against keys: +{NUMBER} / {NUMBER} / {NUMBER}$"),
    ("classify_probes.py", ["tiny", "--only", "text,weights,successor"], rf"^all: cpu {NUMBER} s$"),
    ("rare_syntactic.py", ["tiny"], r"^\| nsubj \| head->dependent \| \d+ \|"),
    ("name_mover_ablation.py", ["{small}"], rf"^IOI logit difference {NUMBER}, IO above S in \d+%$"),
    ("bench_scale_classify.py", ["--needles-only", "--max-length", "64"], r"identical scores: True$"),
    (
        "ioi_direct_effects.py",
        ["{small}", "--sweep", "1"],
        rf"^  ablated delta [-+]?{NUMBER}  1\.\d: direct [-+]?{NUMBER}",
    ),
    (
        "ioi_mean_ablation.py",
        ["{small}", "--controls", "3", "--heads", "1.0,1.2", "--freeze", "1.1"],
        rf"^    3 same-size sets: min [-+]?{NUMBER} .* p\(lowered at least as much\) = {NUMBER}, p\(raised",
    ),
    ("head_kinds.py", ["{small}"], rf"^- IOI ablation of .*: delta {NUMBER} .* 20 random sets: min {NUMBER}"),
    (
        "eapig_limits.py",
        ["tiny", "induction:4:12", "--points", "2", "--out", "{tmp}/path.pt"],
        r"^3 points in .* holds 3$",
    ),
    (
        "bench_text_memory.py",
        ["--sizes", "0.2", "--dir", "{tmp}"],
        rf"^\| 0\.2 MB \| {NUMBER} MB \| {NUMBER} s \| 0 \|$",
    ),
]
# Scripts with no option smaller than a GPT-2-small-shaped (or SmolLM-shaped) random model swept or captured in
# several fresh subprocesses, or a whole classify per child: each is a benchmark's own run, too long for the
# suite's budget. `make bench-smoke-all` runs them.
HEAVY = [
    ("measure_roles.py", ["headlens/data/tiny"], r"^\| 1\.0 \| -?\d+ \| [\d.]+ \|"),
    ("bench_budget.py", ["tiny", "--budget", "64", "--factor", "2", "--out", "{tmp}"], r'^ "n_heads": 8,$'),
    ("bench_capture.py", ["--rounds", "1", "--repeats", "1"], r'^\{"summary": \{'),
    ("bench_classify.py", ["--rounds", "1", "--repeats", "1"], rf"^max \|ours mul - detect_head\|: \w+ {NUMBER}"),
    (
        "bench_scale_context.py",
        ["--sizes", "256", "512", "--families", "gpt2", "--tl-max", "256"],
        rf"^gpt2 \w+: log-log exponent {NUMBER}$",
    ),
    ("bench_ablate.py", ["--quick"], rf"^attribution vs exact: pearson {NUMBER}, spearman {NUMBER}$"),
    ("bench_attribution.py", [], r"^\| GPT-2-small shape, 4 x 128 tokens"),
    ("bench_arch.py", ["--rounds", "1", "--repeats", "1", "--layers", "0"], r"^\| exact"),
    ("bench_scale_dist.py", [], r"2 ranks equal 1 thread exactly"),
]
PARAMS = [pytest.param(*c, id=c[0]) for c in CASES] + [
    pytest.param(*c, id=c[0], marks=pytest.mark.bench_heavy) for c in HEAVY
]


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    from transformers import GPT2Config

    from headlens.load.models import build_model, save_model

    loaded = build_model(GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128), seed=0, name="small-random")
    return save_model(loaded, tmp_path_factory.mktemp("small_gpt2"))


@pytest.mark.parametrize(("script", "args", "pattern"), PARAMS)
def test_benchmark_runs_and_prints_its_result(script, args, pattern, tmp_path, request):
    small = request.getfixturevalue("small_dir") if "{small}" in args else None
    argv = [a.format(tmp=tmp_path, small=small) for a in args]
    assert_prints(run_script([sys.executable, str(BENCH / script), *argv]), pattern)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([sys.executable, "benchmarks/bench_scale_gpu.py"], "bench_scale_gpu: no CUDA GPU, skipped"),
        (
            ["bash", "benchmarks/gpu_check.sh"],
            "gpu_check: no CUDA GPU on this machine: GPU tests and throughput skipped",
        ),
    ],
    ids=["bench_scale_gpu.py", "gpu_check.sh"],
)
def test_gpu_script_says_no_cuda(argv, line):
    """The no-CUDA path, on any machine: the GPU is hidden from the script (CUDA_VISIBLE_DEVICES empty), so a
    machine with one does not start the real GPU check (bash benchmarks/gpu_check.sh) inside the suite."""
    stdout = run_script(argv, env={"PY": sys.executable, "CUDA_VISIBLE_DEVICES": ""})
    assert line in stdout.splitlines()
