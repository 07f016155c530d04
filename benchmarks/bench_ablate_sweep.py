"""The exact single-head sweep against its FLOP floor, by token count (SmolLM2 by default).

For each token budget the heads of one layer (`--layer`) are swept alone (headlens.ablation.sweep_heads,
zero ablation, loss metric on the default text), the clean run cached beforehand and one head swept first
(warm-up), so the timing is the sweep call itself: the clean run's cache lookup, the walk to the layer,
then per head its layer's MLP, the later blocks and the unembedding of the scored positions.

The floor is the matmul FLOPs the sweep must do (`floor_flops`): the walk (layers before the layer, and
its attention) once; per head the layer's MLP, every later block and the unembedding of the scored
positions; attention scores over the causal half (each query's keys up to itself), real tokens only.
They are taken at the float32 rate of a 2048^3 matmul in the same process, per CPU second; the ratio is
CPU seconds over floor CPU seconds. The full sweep's time is extrapolated from the same FLOP model
(every head) at the ratio measured.

Each measurement runs in its own process. With `--old DIR` (a checkout of other code, put first on
PYTHONPATH) each token count is measured with that code, then this one, side by side; the floor is
this checkout's count for both. `--threads N` sets torch's threads (on a loaded machine OpenMP threads
spinning at barriers count as CPU time; one thread keeps CPU seconds honest).

Run: .venv/bin/python benchmarks/bench_ablate_sweep.py [--model smollm2] [--layer 15] [--tokens 128 512 2048]
     [--old DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


def measure(model: str, layer: int, tokens: int) -> dict:
    """CPU seconds of sweeping `layer`'s heads on `tokens` tokens (clean run cached, warmed up), and the rate."""
    from headlens.ablation.ablate import sweep_heads
    from headlens.heads import Head
    from headlens.intervene.clean import clean_values
    from headlens.intervene.evalspec import EvalSpec
    from headlens.load.models import load_model

    loaded = load_model(model)
    os.environ["HEADLENS_CACHE"] = tempfile.mkdtemp()  # clean runs of this benchmark only (the model is loaded)
    heads = [Head(layer, h) for h in range(loaded.spec.n_heads)]
    evaluation = EvalSpec(tokens=tokens)
    clean_values(loaded, evaluation.build(loaded), None)  # cached: the timing below is the sweep alone
    sweep_heads(loaded, "zero", evaluation, heads=heads[:1])  # warm-up
    rate = cpu_rate()
    cpu = time.process_time()
    sweep_heads(loaded, "zero", evaluation, heads=heads)
    used = time.process_time() - cpu
    return {"cpu": used, "rate": (rate + cpu_rate()) / 2}


def floor_flops(loaded, evalset, layer: int, n_heads: int) -> float:
    """Matmul FLOPs of sweeping `n_heads` heads of `layer` with the clean run cached (module docstring)."""
    from headlens.ablation.estimate import block_weights
    from headlens.arch import adapter_for

    spec = loaded.spec
    tokens = int(evalset.mask.sum())
    lengths = evalset.mask.sum(1)  # [n_seq] real tokens
    pairs = int((lengths * (lengths + 1) // 2).sum())  # causal (query, key) pairs
    scores = 4 * pairs * spec.n_heads * spec.d_head  # q.k and the weighted sum of v
    attn_weights = sum(p.numel() for p in adapter_for(loaded.model).attn(layer).parameters())
    block = 2 * tokens * block_weights(loaded) + scores
    attn = 2 * tokens * attn_weights + scores
    unembed = evalset.n_tokens * 2 * spec.d_model * spec.d_vocab
    return layer * block + attn + n_heads * (block - attn + (spec.n_layers - layer - 1) * block + unembed)


def run_child(args, tokens: int, old: str | None) -> dict:
    env = dict(os.environ)
    if old is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (old, env.get("PYTHONPATH")) if p)
    command = [sys.executable, __file__, "--child", "--model", args.model, "--layer", str(args.layer)]
    command += ["--tokens", str(tokens)] + ([] if args.threads is None else ["--threads", str(args.threads)])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 2048])
    parser.add_argument("--old", help="a checkout of other code to measure beside this one")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure(args.model, args.layer, args.tokens[0])))
        return

    from headlens.ablation.estimate import sweep_flops
    from headlens.heads import all_heads
    from headlens.intervene.evalspec import EvalSpec
    from headlens.load.models import load_model

    loaded = load_model(args.model)
    spec = loaded.spec
    codes = [("old", args.old), ("new", None)] if args.old else [("this", None)]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.model}, the {spec.n_heads} heads of layer {args.layer}")
    print(f"threads {torch.get_num_threads()}; old = {args.old}" if args.old else f"threads {torch.get_num_threads()}")
    print("| tokens | code | sweep CPU s | floor CPU s | ratio | GFLOP/CPU-s | every head extrapolated, CPU min |")
    print("|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        evalset = EvalSpec(tokens=tokens).build(loaded)
        flops = floor_flops(loaded, evalset, args.layer, spec.n_heads)
        full = sweep_flops(loaded, evalset, all_heads(spec.n_layers, spec.n_heads), True)
        for label, old in codes:
            found = run_child(args, tokens, old)
            floor = flops / found["rate"]
            ratio = found["cpu"] / floor
            print(
                f"| {int(evalset.mask.sum()):,} | {label} | {found['cpu']:.1f} | {floor:.1f} | {ratio:.2f} "
                f"| {found['rate'] / 1e9:.0f} | {full / found['rate'] * ratio / 60:.1f} |",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
