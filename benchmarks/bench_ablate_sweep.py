"""The exact single-head sweep against its FLOP floor, by token count (SmolLM2 by default).

For each token budget the heads of one layer (`--layer`) are swept alone (headlens.ablation.sweep_heads,
zero ablation, loss metric on the default text), the clean run cached beforehand (so the timing is the
sweep itself: the walk to the layer, then per head its layer's MLP, the later blocks and the unembedding
of the scored positions). The floor is those matmul FLOPs (headlens.ablation.estimate, counted for the
walk to the layer and the layer's heads) at the float32 rate of a 2048^3 matmul in the same process,
per CPU second; the ratio is CPU seconds over floor CPU seconds. The full sweep's time is extrapolated
from the same FLOP model (270 heads) at the ratio measured.

Run: .venv/bin/python benchmarks/bench_ablate_sweep.py [--model smollm2] [--layer 15] [--tokens 128 512 2048]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def cpu_rate(repeats: int = 5) -> float:
    """FLOP per CPU second of a float32 2048^3 matmul."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    cpu = time.process_time()
    for _ in range(repeats):
        torch.mm(a, b)
    return repeats * 2 * 2048**3 / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 2048])
    args = parser.parse_args()

    from headlens.ablation.ablate import sweep_heads
    from headlens.ablation.clean import clean_values
    from headlens.ablation.estimate import sweep_flops
    from headlens.ablation.evalspec import EvalSpec
    from headlens.heads import Head, all_heads
    from headlens.load.models import load_model

    loaded = load_model(args.model)
    os.environ["HEADLENS_CACHE"] = tempfile.mkdtemp()  # clean runs of this benchmark only (the model is loaded)
    spec = loaded.spec
    heads = [Head(args.layer, h) for h in range(spec.n_heads)]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.model}, the {len(heads)} heads of layer {args.layer}")
    print("| tokens | sweep CPU s | floor CPU s | ratio | GFLOP/CPU-s (matmul) | full sweep extrapolated, CPU min |")
    print("|---|---|---|---|---|---|")
    for tokens in args.tokens:
        evaluation = EvalSpec(tokens=tokens)
        evalset = evaluation.build(loaded)
        clean_values(loaded, evalset, None)  # cached: the timing below is the sweep alone
        rate = cpu_rate()
        cpu = time.process_time()
        sweep_heads(loaded, "zero", evaluation, heads=heads)
        used = time.process_time() - cpu
        rate = (rate + cpu_rate()) / 2
        per_block = sweep_flops(loaded, evalset, [], True) / spec.n_layers  # one block over the set
        flops = (args.layer + 1) * per_block + sweep_flops(loaded, evalset, heads, True) - spec.n_layers * per_block
        ratio = used / (flops / rate)
        full = sweep_flops(loaded, evalset, all_heads(spec.n_layers, spec.n_heads), True)
        print(
            f"| {int(evalset.mask.sum()):,} | {used:.1f} | {flops / rate:.1f} | {ratio:.2f} | {rate / 1e9:.0f} "
            f"| {full / rate * ratio / 60:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
