"""Throughput on a CUDA GPU, float32 against bfloat16 (run by benchmarks/gpu_check.sh).

  capture  tokens/s of `run_capture` with classify's natural-text reducers (every head's
           previous/current/first-token mass and Voita offset) on 8 x 1024 random tokens
  sweep    tokens/s of the exact single-head sweep (`sweep_heads`, metric repeat: 16 x 51
           tokens) over the heads of layers 0, 5 and 11 (36 heads): evaluation tokens x heads / s
Model: GPT-2-small shape, random weights. One warm-up run each; CUDA synchronised around timings.
Prints one markdown table; without CUDA prints one line and exits 0.

    .venv/bin/python benchmarks/bench_scale_gpu.py
"""

from __future__ import annotations

import time

import torch


def _timed(fn) -> float:
    fn()  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _rows(dtype: str) -> dict:
    from headlens.ablation import sweep_heads
    from headlens.capture import iter_batches, run_capture
    from headlens.heads import Head
    from headlens.models import build_model
    from headlens.scores.positional import (
        ArgmaxOffsetReducer,
        current_token_reducer,
        first_token_reducer,
        prev_token_reducer,
    )

    loaded = build_model(None, seed=0)
    loaded.model.to("cuda", getattr(torch, dtype))
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    ids = torch.randint(1000, 10000, (8, 1024))  # [batch, pos]

    def capture():
        reducers = [
            prev_token_reducer(n, h),
            current_token_reducer(n, h),
            first_token_reducer(n, h),
            ArgmaxOffsetReducer(n, h),
        ]
        run_capture(loaded.model, iter_batches(ids, 8), reducers)

    heads = [Head(layer, head) for layer in (0, 5, 11) for head in range(h)]
    capture_s = _timed(capture)
    sweep_s = _timed(lambda: sweep_heads(loaded, metric="repeat", heads=heads))
    return {"capture": ids.numel() / capture_s, "sweep": 16 * 51 * len(heads) / sweep_s}


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_scale_gpu: no CUDA GPU, skipped")
        return
    rows = {dtype: _rows(dtype) for dtype in ("float32", "bfloat16")}
    print(f"\n| {torch.cuda.get_device_name()} | float32 tokens/s | bfloat16 tokens/s | bf16 / fp32 |")
    print("|---|---|---|---|")
    for name in ("capture", "sweep"):
        fp32, bf16 = rows["float32"][name], rows["bfloat16"][name]
        print(f"| {name} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f} |")


if __name__ == "__main__":
    main()
