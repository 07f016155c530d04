"""float32 matrix products of SmolLM2's forward pass: MKL (torch's default on CPU) against oneDNN.

torch routes a float32 `F.linear` on CPU to MKL's sgemm; oneDNN's JIT kernels are reached through
`torch.ops.mkldnn._linear_pointwise` (the operator torch.compile's CPU backend uses), with the weight
packed once (`torch.ops.mkldnn._reorder_linear_weight`) or as it is (plain: what headlens.arch.kernels
runs). Each shape is timed interleaved, `--reps` calls per backend per round, and the best round's rate
is kept (on a shared machine the best round is the one least disturbed). The largest difference of
MKL's and plain oneDNN's products is printed beside the rates.

    python benchmarks/bench_gemm_backends.py [--threads 2] [--rounds 5] [--reps 4]
"""

from __future__ import annotations

import argparse
import time

import torch

# (rows, d_in, d_out): the MLP's gate/up and down, the attention's q/o and k/v, one unembedding chunk
SHAPES = [(4096, 576, 1536), (4096, 1536, 576), (4096, 576, 576), (4096, 576, 192), (4092, 576, 4096)]


def rate(fn, flops: float, reps: int) -> float:
    """GFLOP/s of `reps` calls of fn after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return flops * reps / (time.perf_counter() - start) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    head = "| rows x d_in x d_out | MKL GFLOP/s | oneDNN packed | oneDNN plain | plain / MKL | max diff |"
    print(f"{args.threads} threads\n\n{head}\n|---|---|---|---|---|---|")
    for rows, d_in, d_out in SHAPES:
        x, w = torch.randn(rows, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen) / d_in**0.5
        packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=rows)
        flops = 2.0 * rows * d_in * d_out
        calls = {
            "mkl": lambda x=x, w=w: torch.nn.functional.linear(x, w),
            "packed": lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
            "plain": lambda x=x, w=w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
        }
        best = dict.fromkeys(calls, 0.0)
        for _ in range(args.rounds):
            for name, fn in calls.items():
                best[name] = max(best[name], rate(fn, flops, args.reps))
        diff = float((calls["mkl"]() - calls["plain"]()).abs().max())
        rates = " | ".join(f"{best[name]:.0f}" for name in calls)
        print(f"| {rows} x {d_in} x {d_out} | {rates} | {best['plain'] / best['mkl']:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
