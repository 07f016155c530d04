"""Where a first `ablate MODEL --heads 3.4,5.1` spends its forward passes: FLOPs and achieved GFLOP/s per part.

Runs `set_values` (the clean set and the chosen set, the clean run not cached) under torch.profiler with
record_shapes and sorts every operator's own time into parts: the matrix products of the blocks and of
the unembedding (FLOPs 2 M K N from their shapes), the attention kernel (causal: half of the 4 B H T^2 D
of Q K^T and A V), the unembedding's logsumexp (exp, shift, sums) and every other operator (norms,
rotary, SiLU, residual adds, copies). The profiler's own overhead is included in the wall time.

    python benchmarks/bench_ablate_parts.py [--model smollm2] [--heads 3.4,5.1] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from headlens.classify.roles import resolve_heads
from headlens.intervene.evalspec import EvalSpec
from headlens.intervene.replace import replacements
from headlens.intervene.stacked import set_values
from headlens.load.models import load_model

GEMMS = ("aten::mm", "aten::addmm")
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"
LOGSUMEXP = ("aten::exp_", "aten::exp", "aten::sub_", "aten::sub", "aten::amax", "aten::log_", "aten::logsumexp")


def part_of(name: str, shapes: list, d_vocab_chunk: int) -> tuple[str, float]:
    """(part, FLOPs) of one profiled operator call from its name and input shapes."""
    if name in GEMMS:
        a, b = shapes[-2], shapes[-1]  # addmm: (bias, a, b)
        flops = 2.0 * a[0] * a[1] * b[1]
        return ("unembedding matmuls" if b[1] == d_vocab_chunk else "block matmuls"), flops
    if name == ATTENTION:
        batch, heads, length, d_head = shapes[0]
        return "attention (sdpa, causal)", 4.0 * batch * heads * length * length * d_head / 2
    if name in LOGSUMEXP and shapes and len(shapes[0]) == 2 and shapes[0][1] == d_vocab_chunk:
        return "unembedding logsumexp", 0.0
    return "everything else", 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", default="3.4,5.1")
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    from headlens.intervene.metrics import UNEMBED_CHUNK

    loaded = load_model(args.model)
    evalset = EvalSpec(metric="loss", tokens=args.tokens).build(loaded, 0)
    heads, _ = resolve_heads(loaded, args.heads, None)
    reps = replacements(loaded.model, evalset, "zero", 0, batch_size=None)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start, cpu = time.perf_counter(), time.process_time()
        set_values(loaded.model, evalset, [[], heads], reps, None)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    parts: dict[str, list[float]] = {}
    others: dict[str, float] = {}  # the rest, by operator
    for event in prof.key_averages(group_by_input_shape=True):
        part, flops = part_of(event.key, event.input_shapes, UNEMBED_CHUNK)
        seconds, total = parts.setdefault(part, [0.0, 0.0])
        parts[part] = [seconds + event.self_cpu_time_total / 1e6, total + flops * event.count]
        if part == "everything else":
            others[event.key] = others.get(event.key, 0.0) + event.self_cpu_time_total / 1e6
    print(f"set_values: {wall:.1f} s wall, {cpu:.1f} CPU s, {torch.get_num_threads()} threads\n")
    print("| part | s | share | GFLOP | GFLOP/s |\n|---|---|---|---|---|")
    for part, (seconds, flops) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        rate = f"{flops / seconds / 1e9:.0f}" if flops else ""
        print(f"| {part} | {seconds:.2f} | {seconds / wall:.0%} | {flops / 1e9:.0f} | {rate} |")
    top = sorted(others.items(), key=lambda kv: -kv[1])[:10]
    print("\neverything else, by operator: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
