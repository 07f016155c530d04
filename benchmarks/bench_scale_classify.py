"""`headlens classify` on a GPT-2-small-shaped model as a user runs it, and the needle probe
with and without the key/value cache.

  whole      `headlens classify DIR` (a GPT2Config() model with random weights saved to DIR),
             wall time of the command, default settings (needles on, cached decoding)
  no-needles the same with `--no-needles`
  needles    `retrieval_scores` alone on classify's needle prompts (15 tests: 3 lengths x 5
             depths, 12 generated tokens each): cache=True (prefill once, one token per step)
             against cache=False (one whole forward per generated token, the former decoder);
             per-head hits checked identical
The former whole classify is estimated as whole - needles(cached) + needles(uncached).
Wall and CPU seconds are both reported (CPU: user + system of the command, or of this process
for the needle probe), since on a shared machine the wall time mostly measures the neighbours.

    .venv/bin/python benchmarks/bench_scale_classify.py [--threads 2]
    .venv/bin/python benchmarks/bench_scale_classify.py --needles-only --max-length 256   (quick: the
        needle probe alone, on the tests whose prompts fit in 256 tokens)
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cli_seconds(model_dir: Path, *extra: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one `headlens classify DIR ...` command."""
    headlens = Path(sys.executable).parent / "headlens"
    start, cpu = time.perf_counter(), _cpu_children()
    subprocess.run(
        [str(headlens), "classify", str(model_dir), "--no-progress", "--format", "csv", *extra],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start, _cpu_children() - cpu


def _needle_seconds(loaded, max_length: int | None = None) -> dict:
    from headlens.classify import ClassifyConfig
    from headlens.probes import inputs as probes
    from headlens.probes.inputs import random_token_range
    from headlens.scores.retrieval import retrieval_scores

    config, spec = ClassifyConfig(), loaded.spec
    ids = loaded.tokenizer(probes.default_text(), add_special_tokens=False)["input_ids"]
    prompts = probes.needle_prompts(
        ids,
        spec.n_ctx,
        loaded.bos_token_id,
        random_token_range(spec.d_vocab),
        needle_len=config.needle_len,
        restate=config.needle_restate,
        seed=config.seed,
    )
    prompts = [p for p in prompts if max_length is None or p.context <= max_length]
    out = {"n_tests": len(prompts)}
    results = {}
    for cache in (True, False):
        start, cpu = time.perf_counter(), time.process_time()
        results[cache] = retrieval_scores(loaded.model, prompts, cache=cache)
        out["cached" if cache else "uncached"] = (time.perf_counter() - start, time.process_time() - cpu)
    same = torch.equal(results[True]["score"].nan_to_num(-1), results[False]["score"].nan_to_num(-1))
    out["identical"] = same and results[True]["n_retrieved"] == results[False]["n_retrieved"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--needles-only", action="store_true", help="skip the two CLI runs")
    parser.add_argument("--max-length", type=int, default=None, help="only needle tests of at most this context")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from headlens.load.models import build_model, load_model, save_model

    if args.needles_only:
        needles = _needle_seconds(build_model(None, seed=0, name="gpt2-shaped-random"), args.max_length)
        (cw, cc), (uw, uc) = needles["cached"], needles["uncached"]
        print(
            f"needle probe, {needles['n_tests']} tests (context <= {args.max_length}): cached {cw:.1f} s wall / "
            f"{cc:.1f} s CPU, uncached {uw:.1f} s / {uc:.1f} s: x{uw / cw:.1f} wall, x{uc / cc:.1f} CPU; "
            f"identical scores: {needles['identical']}"
        )
        return

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model(build_model(None, seed=0, name="gpt2-shaped-random"), Path(tmp) / "gpt2-shaped")
        whole = _cli_seconds(model_dir)
        no_needles = _cli_seconds(model_dir, "--no-needles")
        needles = _needle_seconds(load_model(str(model_dir)))
    cached, uncached = needles["cached"], needles["uncached"]
    print("| run | wall s | CPU s |\n|---|---|---|")
    print(f"| `headlens classify DIR` (cached needles) | {whole[0]:.1f} | {whole[1]:.1f} |")
    print(f"| `headlens classify DIR --no-needles` | {no_needles[0]:.1f} | {no_needles[1]:.1f} |")
    print(f"| needle probe alone, cached ({needles['n_tests']} tests) | {cached[0]:.1f} | {cached[1]:.1f} |")
    print(f"| needle probe alone, uncached | {uncached[0]:.1f} | {uncached[1]:.1f} |")
    print(
        f"| former whole classify (estimated) | {whole[0] - cached[0] + uncached[0]:.1f} | "
        f"{whole[1] - cached[1] + uncached[1]:.1f} |"
    )
    print(
        f"needles uncached / cached: x{uncached[0] / cached[0]:.1f} wall, x{uncached[1] / cached[1]:.1f} CPU; "
        f"identical scores: {needles['identical']}"
    )


if __name__ == "__main__":
    main()
