"""Long contexts: peak memory added by capturing every head's statistics over one sequence of T
tokens, headlens's lean path against TransformerLens `run_with_cache` of every pattern.

  ours  `run_capture` with classify's natural-text reducers (previous/current/first-token mass,
        Voita argmax offset) on all heads: sdpa forward, patterns rebuilt in blocks of query rows
  tl    `TransformerBridge.run_with_cache(ids, names_filter=hook_pattern)`: every layer's
        [1, head, T, T] pattern kept (run only at the sizes given by --tl-max)
Models (random weights): GPT-2-small shape with n_positions raised to the largest T, and a Llama
with SmolLM-135M's shape (30 layers, 9 query / 3 key-value heads, d_model 576, rotary). Each
point runs in a fresh child: model built, a 256-token warm-up pass, the RSS high-water mark reset,
one pass at T; added peak = VmHWM - RSS at the reset. The exponent is the least-squares slope
of log(peak) on log(T).

    .venv/bin/python benchmarks/bench_scale_context.py [--sizes 1024 2048 4096 8192] [--tl-max 2048]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import torch
from peak_memory import reset_peak, status_kb  # benchmarks/ is on sys.path when run as a script


def _model(family: str, n_ctx: int):
    from headlens.load.models import build_model

    if family == "gpt2":
        from transformers import GPT2Config

        return build_model(GPT2Config(n_positions=n_ctx), seed=0, name="gpt2-shaped")
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=n_ctx,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    return build_model(config, seed=0, name="smollm-135m-shaped")


def _child(family: str, side: str, size: int, n_ctx: int) -> None:
    from headlens.capture import Batch, run_capture
    from headlens.scores.positional import (
        ArgmaxOffsetReducer,
        current_token_reducer,
        first_token_reducer,
        prev_token_reducer,
    )

    torch.set_num_threads(2)
    loaded = _model(family, n_ctx)
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    bridge = None
    if side == "tl":
        from headlens.load.models import boot_bridge

        bridge = boot_bridge(loaded)

    def run(length: int) -> None:
        ids = torch.randint(100, 10000, (1, length))  # [1, pos]
        if bridge is not None:
            with torch.no_grad():
                _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name.endswith("hook_pattern"))
            del cache
            return
        reducers = [
            prev_token_reducer(n, h),
            current_token_reducer(n, h),
            first_token_reducer(n, h),
            ArgmaxOffsetReducer(n, h),
        ]
        run_capture(loaded.model, [Batch(ids, torch.ones_like(ids, dtype=torch.bool))], reducers)

    run(256)
    base = reset_peak()
    run(size)
    print(json.dumps({"peak_mb": (status_kb("VmHWM") - base) / 1024}))


def _fit(points: list[tuple[int, float]]) -> float:
    xs, ys = [math.log(t) for t, _ in points], [math.log(m) for _, m in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--tl-max", type=int, default=2048)
    parser.add_argument("--families", nargs="+", default=["gpt2", "llama"])
    args = parser.parse_args()
    n_ctx = max(args.sizes)
    for family in args.families:
        for side in ("ours", "tl"):
            points = []
            for size in args.sizes:
                if side == "tl" and size > args.tl_max:
                    continue
                out = subprocess.run(
                    [sys.executable, __file__, "--child", family, side, str(size), str(n_ctx)],
                    capture_output=True,
                    text=True,
                )
                if out.returncode != 0:
                    print(f"{family} {side} T={size}: failed ({out.stderr.strip().splitlines()[-1:]})")
                    break
                peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
                points.append((size, peak))
                print(f"{family} {side} T={size}: {peak:.0f} MB", flush=True)
            if len(points) >= 2:
                print(f"{family} {side}: log-log exponent {_fit(points):.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
