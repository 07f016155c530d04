"""Throughput on a CUDA GPU at SmolLM2-135M's shape, float32 against bfloat16 (run by
benchmarks/gpu_check.sh). Random weights: no GPU can reach the package index, and a carried payload
must stay small (30 layers, d_model 576, 9 query heads over 3 key/value heads, d_head 64, MLP 1536;
vocabulary 50,257, the GPT-2 tokenizer's, so the probes run unchanged).

  forward  tokens/s of the bare trunk (no hooks, no grad): the bound capture is measured against
  capture  tokens/s of `run_capture` with classify's natural-text reducers (every head's
           previous/current/first-token mass and Voita offset) on 8 x 1024 random tokens, and the
           host synchronisations per batch it makes (torch.cuda.set_sync_debug_mode warnings)
  sweep    tokens/s of the exact single-head sweep (`sweep_heads`, metric repeat: 16 x 51
           tokens) over the heads of layers 0, 15 and 29 (27 heads): evaluation tokens x heads / s
Targets (issue: the GPU path): capture >= 50% of the bare bf16 forward's tokens/s; bf16 >= 1.5x
float32 for capture and the sweep; at most one host synchronisation per capture batch.
One warm-up run each; the device synchronised around timings. Prints markdown tables; without
CUDA prints one line and exits 0. `--device cpu --layers 2 --tokens 64` is a smoke run of the code.

    .venv/bin/python benchmarks/bench_scale_gpu.py
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

BATCH = 8  # capture sequences per batch


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    fn()  # warm-up: kernels, allocator
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _model(args, dtype: str):
    from transformers import LlamaConfig

    from headlens.load.models import build_model

    config = LlamaConfig(
        vocab_size=50257,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=max(2048, args.tokens),
        tie_word_embeddings=True,
    )
    loaded = build_model(config, seed=0, name="smollm2-shape")
    loaded.model.to(args.device, getattr(torch, dtype))
    return loaded


def _syncs_per_batch(capture, device: str, n_batches: int) -> float:
    """Host synchronisations CUDA reports during one capture, per batch (NaN off CUDA)."""
    if device != "cuda":
        return float("nan")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            capture()
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen) / n_batches


def _rows(args, dtype: str) -> dict:
    from headlens.ablation import sweep_heads
    from headlens.capture import iter_batches, run_capture
    from headlens.heads import Head
    from headlens.scores.positional import (
        ArgmaxOffsetReducer,
        current_token_reducer,
        first_token_reducer,
        prev_token_reducer,
    )

    loaded = _model(args, dtype)
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    ids = torch.randint(1000, 10000, (2 * BATCH, args.tokens))  # [batch, pos]: two batches
    adapter = loaded.adapter

    def forward():
        with torch.no_grad():
            for batch in iter_batches(ids, BATCH):
                adapter.run_trunk(batch.input_ids.to(args.device), batch.mask.to(args.device))

    def capture():
        reducers = [prev_token_reducer(n, h), current_token_reducer(n, h), first_token_reducer(n, h)]
        run_capture(loaded.model, iter_batches(ids, BATCH), [*reducers, ArgmaxOffsetReducer(n, h)])

    heads = [Head(layer, head) for layer in sorted({0, n // 2, n - 1}) for head in range(h)]
    n_eval = 16 * 51 if args.tokens >= 103 else 16 * (args.tokens // 2)
    return {
        "forward": ids.numel() / _timed(forward, args.device),
        "capture": ids.numel() / _timed(capture, args.device),
        "syncs": _syncs_per_batch(capture, args.device, 2),
        "sweep": n_eval * len(heads) / _timed(lambda: sweep_heads(loaded, metric="repeat", heads=heads), args.device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per capture sequence")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_scale_gpu: no CUDA GPU, skipped")
        return
    rows = {dtype: _rows(args, dtype) for dtype in ("float32", "bfloat16")}
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"\n| {name}, SmolLM2-135M shape | float32 tokens/s | bfloat16 tokens/s | bf16 / fp32 | target |")
    print("|---|---|---|---|---|")
    for step in ("forward", "capture", "sweep"):
        fp32, bf16 = rows["float32"][step], rows["bfloat16"][step]
        target = "" if step == "forward" else ">= 1.5"
        print(f"| {step} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f} | {target} |")
    bf16 = rows["bfloat16"]
    print("\n| check | figure | target |\n|---|---|---|")
    print(f"| bf16 capture / bare bf16 forward | {bf16['capture'] / bf16['forward']:.2f} | >= 0.50 |")
    for dtype, row in rows.items():
        print(f"| host syncs per capture batch, {dtype} | {row['syncs']:.1f} | <= 1 |")


if __name__ == "__main__":
    main()
