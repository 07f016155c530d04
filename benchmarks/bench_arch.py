"""A Llama-family model through headlens, side by side with a bare forward and TransformerLens.

Model: `LlamaConfig` with SmolLM-135M's shape (30 layers, 9 query heads over 3 key/value heads,
d_model 576, d_head 64, MLP 1536, vocabulary 49,152, tied embeddings), random weights, seed 0,
float32, 2 threads. Sections, each in fresh subprocesses (peak memory is the child's own):

capture, batch 1 x 2048 tokens (the method of benchmarks/bench_capture.py: glibc's mmap threshold
pinned at 1 MiB, VmHWM reset after set-up, added peak = VmHWM - RSS at the reset over 1 + repeats
passes; time = min / median of the passes after the first, and their CPU time, steadier under load):
  hf_forward       (a) a bare Hugging Face eager forward, logits included
  capture_prev     (b) run_capture + prev_token_reducer over all 270 heads (the default lean path)
  bridge_patterns  (c) TransformerLens bridge run_with_cache of every hook_pattern
sweep, 4 x 128 tokens (BOS + random ids), every next-token prediction counted:
  exact            headlens's exact zero-ablation sweep (base_sums + sweep_sums)
  tl_loop          the bridge's `run_with_hooks(return_type="loss")` zeroing hook_z[:, :, h], one
                   full forward per head; its deltas are compared with ours (target <= 1e-4)
`--layers 0,7,14,21,29` restricts both sweeps to those layers' heads (the same heads for both),
for a shorter run on a loaded machine; the default is all 270 heads.

    nice -n 10 .venv/bin/python benchmarks/bench_arch.py [--rounds 1 --repeats 1] [--layers ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from peak_memory import reset_peak, status_kb  # benchmarks/ is on sys.path when run as a script
from tl_loop import zero_ablation_deltas

THREADS = 2
CAPTURE_TOKENS = 2048
N_SEQ, SEQ_LEN = 4, 128
CAPTURE_VARIANTS = ["hf_forward", "capture_prev", "bridge_patterns"]
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576"}  # as in bench_capture.py


def smollm_shaped():
    """A LoadedModel: Llama with SmolLM-135M's shape, random weights (seed 0)."""
    from transformers import LlamaConfig

    from headlens.load.models import build_model

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    return build_model(config, seed=0, name="smollm-135m-shaped-random")


def _ids(batch: int, pos: int, bos: int) -> torch.Tensor:
    ids = torch.randint(1000, 10000, (batch, pos), generator=torch.Generator().manual_seed(0))  # [batch, pos]
    ids[:, 0] = bos
    return ids


def _capture_step(variant: str):
    """Build the model (and bridge) for `variant`; return a no-arg function running one pass."""
    from headlens.capture import Batch, run_capture
    from headlens.load.models import boot_bridge
    from headlens.scores.positional import prev_token_reducer

    loaded = smollm_shaped()
    ids = _ids(1, CAPTURE_TOKENS, 0)
    if variant == "bridge_patterns":
        bridge = boot_bridge(loaded)
        del loaded  # the bridge holds its own copy: one set of weights, as the others

        def step():
            with torch.no_grad():
                _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name.endswith("hook_pattern"))
            return len(cache)

        return step
    model = loaded.model
    if variant == "hf_forward":
        return lambda: torch.no_grad()(model)(ids).logits.shape
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))

    def step():
        reducer = prev_token_reducer(loaded.spec.n_layers, loaded.spec.n_heads)
        run_capture(model, [batch], [reducer])
        return reducer.result().shape  # [n_layers, n_heads]

    return step


def run_capture_variant(variant: str, repeats: int) -> dict:
    import ctypes
    import gc

    step = _capture_step(variant)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base_kb = reset_peak()
    step()  # first pass: counted for memory, not for time
    times, cpu_times = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu)
    return {"times": times, "cpu_times": cpu_times, "added_peak_mb": (status_kb("VmHWM") - base_kb) / 1024}


def _sweep_setup():
    from headlens.intervene.evalset import EvalSet

    loaded = smollm_shaped()
    ids = _ids(N_SEQ, SEQ_LEN, 0)
    mask = torch.ones_like(ids, dtype=torch.bool)  # [n_seq, pos]
    counted = torch.ones((N_SEQ, SEQ_LEN - 1), dtype=torch.bool)  # [n_seq, pos-1]
    return loaded, EvalSet(ids, mask, counted, "loss", "bench", "random tokens")


def run_exact(layers: list[int]) -> dict:
    from headlens.heads import Head
    from headlens.intervene.sums import base_sums, sweep_sums

    loaded, evalset = _sweep_setup()
    heads = [Head(layer, h) for layer in layers for h in range(loaded.spec.n_heads)]
    base_kb = reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    base = base_sums(loaded.model, evalset)
    found = {}
    sweep_sums(loaded.model, evalset, heads, [None] * loaded.spec.n_layers, lambda h, s: found.update({h: s}))
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "peak_mb": (status_kb("VmHWM") - base_kb) / 1024,
        "deltas": [float((found[h] - base).sum() / evalset.n_tokens) for h in heads],
    }


def run_tl_loop(layers: list[int]) -> dict:
    from headlens.load.models import boot_bridge

    loaded, evalset = _sweep_setup()
    bridge = boot_bridge(loaded)
    n_heads = loaded.spec.n_heads
    del loaded
    tokens = evalset.input_ids
    base_kb = reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    deltas = zero_ablation_deltas(bridge, tokens, layers, n_heads)
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "peak_mb": (status_kb("VmHWM") - base_kb) / 1024,
        "deltas": deltas,
    }


def _child(args: list[str], env=None) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def capture_table(rounds: int, repeats: int) -> None:
    runs: dict[str, list[dict]] = {v: [] for v in CAPTURE_VARIANTS}
    env = {**os.environ, **CHILD_ENV}
    for _ in range(rounds):
        for variant in CAPTURE_VARIANTS:
            runs[variant].append(_child(["--capture", variant, "--repeats", str(repeats)], env))
    summary = {
        v: {
            "min_s": min(t for r in rs for t in r["times"]),
            "median_s": statistics.median(t for r in rs for t in r["times"]),
            "min_cpu_s": min(t for r in rs for t in r["cpu_times"]),
            "added_peak_mb": statistics.median(r["added_peak_mb"] for r in rs),
        }
        for v, rs in runs.items()
    }
    print(f"capture, 1 x {CAPTURE_TOKENS} tokens; {rounds} subprocess(es) x (1 + {repeats}) passes per variant")
    print("| variant | min s | median s | min CPU s | added peak MB |\n|---|---|---|---|---|")
    for variant, s in summary.items():
        print(
            f"| {variant} | {s['min_s']:.2f} | {s['median_s']:.2f} | {s['min_cpu_s']:.2f} | {s['added_peak_mb']:.0f} |"
        )
    cap, fwd, tl = summary["capture_prev"], summary["hf_forward"], summary["bridge_patterns"]
    print(
        f"time (b)/(a): min {cap['min_s'] / fwd['min_s']:.2f}, median {cap['median_s'] / fwd['median_s']:.2f}, "
        f"CPU {cap['min_cpu_s'] / fwd['min_cpu_s']:.2f} (target <= 1.3);\n"
        f"added peak (b)/(c) = {cap['added_peak_mb'] / tl['added_peak_mb']:.3f} (target <= 0.25)"
    )
    print(json.dumps({"capture": runs}))


def sweep_table(layers: list[int]) -> None:
    spec = ",".join(map(str, layers))
    exact = _child(["--exact", spec])
    tl = _child(["--tl-loop", spec])
    diff = max(abs(a - b) for a, b in zip(exact["deltas"], tl["deltas"], strict=True))
    print(f"zero-ablation sweep of {len(exact['deltas'])} heads (layers {spec}), {N_SEQ} x {SEQ_LEN} tokens")
    print("| sweep | wall s | CPU s | peak MB |\n|---|---|---|---|")
    for label, res in (("exact, headlens", exact), ("TransformerLens run_with_hooks loop", tl)):
        print(f"| {label} | {res['wall_s']:.1f} | {res['cpu_s']:.1f} | {res['peak_mb']:.0f} |")
    print(
        f"TL loop / exact: wall {tl['wall_s'] / exact['wall_s']:.2f}x, CPU {tl['cpu_s'] / exact['cpu_s']:.2f}x "
        f"(target >= 1.5); max |delta exact - delta TL| = {diff:.2e} (target <= 1e-4); "
        f"largest |delta| {max(abs(d) for d in tl['deltas']):.3e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fresh subprocesses per capture variant")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per capture subprocess")
    parser.add_argument("--layers", default=None, help="sweep only these layers' heads (default: all 30)")
    parser.add_argument("--skip", choices=["capture", "sweep"], default=None, help="leave one section out")
    parser.add_argument("--capture", choices=CAPTURE_VARIANTS, help=argparse.SUPPRESS)  # child modes
    parser.add_argument("--exact", help=argparse.SUPPRESS)
    parser.add_argument("--tl-loop", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    if args.capture:
        print(json.dumps(run_capture_variant(args.capture, args.repeats)))
    elif args.exact:
        print(json.dumps(run_exact([int(x) for x in args.exact.split(",")])))
    elif args.tl_loop:
        print(json.dumps(run_tl_loop([int(x) for x in args.tl_loop.split(",")])))
    else:
        layers = [int(x) for x in args.layers.split(",")] if args.layers else list(range(30))
        print(
            f"Llama, SmolLM-135M shape (30 x 9 query heads over 3 kv heads, d_model 576), random weights, "
            f"float32, {THREADS} threads, torch {torch.__version__}"
        )
        if args.skip != "capture":
            capture_table(args.rounds, args.repeats)
        if args.skip != "sweep":
            sweep_table(layers)


if __name__ == "__main__":
    main()
