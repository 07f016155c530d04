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

    .venv/bin/python benchmarks/bench_scale_classify.py [--threads 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _cli_seconds(model_dir: Path, *extra: str) -> float:
    headlens = Path(sys.executable).parent / "headlens"
    start = time.perf_counter()
    subprocess.run([str(headlens), "classify", str(model_dir), "--no-progress", "--format", "csv", *extra],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _needle_seconds(loaded) -> dict:
    from headlens import probes
    from headlens.classify import ClassifyConfig
    from headlens.probes import random_token_range
    from headlens.scores.retrieval import retrieval_scores

    config, spec = ClassifyConfig(), loaded.spec
    ids = loaded.tokenizer(probes.default_text(), add_special_tokens=False)["input_ids"]
    prompts = probes.needle_prompts(ids, spec.n_ctx, loaded.bos_token_id, random_token_range(spec.d_vocab),
                                    needle_len=config.needle_len, restate=config.needle_restate, seed=config.seed)
    out = {"n_tests": len(prompts)}
    results = {}
    for cache in (True, False):
        start = time.perf_counter()
        results[cache] = retrieval_scores(loaded.model, prompts, cache=cache)
        out["cached" if cache else "uncached"] = time.perf_counter() - start
    same = torch.equal(results[True]["score"].nan_to_num(-1), results[False]["score"].nan_to_num(-1))
    out["identical"] = same and results[True]["n_retrieved"] == results[False]["n_retrieved"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from headlens.models import build_model, load_model, save_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model(build_model(None, seed=0, name="gpt2-shaped-random"), Path(tmp) / "gpt2-shaped")
        whole = _cli_seconds(model_dir)
        no_needles = _cli_seconds(model_dir, "--no-needles")
        needles = _needle_seconds(load_model(str(model_dir)))
    print(f"headlens classify DIR (GPT-2-small shape, {args.threads} threads): {whole:.1f} s")
    print(f"headlens classify DIR --no-needles: {no_needles:.1f} s")
    print(f"needle probe alone ({needles['n_tests']} tests): cached {needles['cached']:.1f} s, "
          f"uncached {needles['uncached']:.1f} s, x{needles['uncached'] / needles['cached']:.1f}; "
          f"identical scores: {needles['identical']}")
    print(f"former whole classify (estimated): {whole - needles['cached'] + needles['uncached']:.1f} s")


if __name__ == "__main__":
    main()
