"""Capture cost, side by side: time and peak memory of one 1 x 1024-token pass, GPT-2-small shape.

Variants (each in a fresh subprocess, so one variant's freed memory cannot hide another's):
  hf_forward      (a) a bare Hugging Face eager forward, logits included
  hf_trunk        (a') the same without the LM head (what capture runs; shows the hook overhead alone)
  capture_prev    (b) headlens run_capture with prev_token_reducer: prev_token_score of all 144 heads
                  (the default lean path: sdpa forward, patterns rebuilt in blocks of query rows)
  capture_eager   (b') the same with recompute_patterns=False: eager attention, whole patterns from hooks
  bridge_patterns (c) TransformerLens bridge run_with_cache of every hook_pattern (names_filter)
  bridge_all      (c') bridge run_with_cache with no filter (TransformerLens's default: every hook)

Peak memory: torch allocates on the C++ side, so tracemalloc sees none of it; we read the
kernel's RSS high-water mark instead. Every subprocess runs with glibc's mmap threshold pinned at
1 MiB (MALLOC_MMAP_THRESHOLD_=1048576): by default glibc raises the threshold each time a large
block is freed, so later tensors of up to 32 MB come from the heap and stay resident after
they die, and the peak depended on allocation history by +-100 MB between runs of one variant.
Pinned, every tensor of 1 MiB or more is mapped and unmapped with its lifetime, so RSS follows
the live tensors and repeated runs agree within a few MB. Each subprocess builds the model, hands set-up garbage back
to the kernel (gc + glibc malloc_trim), resets the mark (`echo 5 > /proc/self/clear_refs`,
Linux >= 4.0) and runs 1 + `--repeats` passes: added peak = VmHWM - VmRSS at the reset, over all
passes. The reset comes before the first pass on purpose: memory a pass frees but malloc keeps
would sit in a later baseline and hide the next pass's peak (we measured that: "steady-state"
figures after a warm-up were unstable by +-150 MB and ranked the variants wrongly). One-time
costs of a first pass (thread pools, kernel workspaces) are in every variant alike. Wall time:
min and median of the passes after the first (the machine is shared: min is the least disturbed
run). Rounds alternate the variants so a change in load hits them all alike.

    nice -n 10 .venv/bin/python benchmarks/bench_capture.py --rounds 3 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from peak_memory import reset_peak, status_kb  # benchmarks/ is on sys.path when run as a script

VARIANTS = ["hf_forward", "hf_trunk", "capture_prev", "capture_eager", "bridge_patterns", "bridge_all"]
# glibc: a fixed mmap threshold (see the module docstring); applied to every variant alike.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576"}
N_TOKENS = 1024


def _make_step(variant: str):
    """Build the model (and bridge) for `variant`; return a no-arg function running one pass."""
    import torch

    from headlens.capture import Batch, run_capture
    from headlens.load.models import boot_bridge, build_model
    from headlens.scores.positional import prev_token_reducer

    loaded = build_model(None, seed=0)  # GPT2Config(): 12 layers x 12 heads, d_model 768
    ids = torch.randint(1000, 10000, (1, N_TOKENS), generator=torch.Generator().manual_seed(0))  # [batch, pos]
    ids[:, 0] = loaded.bos_token_id
    if variant.startswith("bridge"):
        bridge = boot_bridge(loaded)
        del loaded  # the bridge holds its own copy: keep one set of weights, as the others do
        names = (lambda name: name.endswith("hook_pattern")) if variant == "bridge_patterns" else None

        def step():
            with torch.no_grad():
                _, cache = bridge.run_with_cache(ids, names_filter=names)
            return len(cache)

        return step
    model = loaded.model
    if variant == "hf_forward":
        return lambda: torch.no_grad()(model)(ids).logits.shape
    if variant == "hf_trunk":
        return lambda: torch.no_grad()(model.transformer)(ids).last_hidden_state.shape
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))

    lean = None if variant == "capture_prev" else False  # None: the library's default (lean here)

    def step():
        reducer = prev_token_reducer(loaded.spec.n_layers, loaded.spec.n_heads)
        run_capture(model, [batch], [reducer], recompute_patterns=lean)
        return reducer.result().shape  # [n_layers, n_heads]

    return step


def _release_free_memory() -> None:
    """Hand memory that Python and glibc malloc hold but do not use back to the kernel."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_variant(variant: str, repeats: int) -> dict:
    """In this process: build, release set-up garbage, reset the peak, run 1 + `repeats` passes."""
    import torch

    torch.set_num_threads(2)
    step = _make_step(variant)
    _release_free_memory()
    base_kb = reset_peak()
    step()  # warm-up pass: counted for memory, not for time
    first_kb = status_kb("VmHWM") - base_kb
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "times": times,
        "added_peak_mb": (status_kb("VmHWM") - base_kb) / 1024,
        "first_pass_added_mb": first_kb / 1024,
        "base_rss_mb": base_kb / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh subprocesses per variant")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per subprocess")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc's dynamic mmap threshold alone (noisier peaks; for comparison)",
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.repeats)))
        return
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    env = dict(os.environ) if args.default_malloc else {**os.environ, **CHILD_ENV}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            out = subprocess.run(
                [sys.executable, __file__, "--variant", variant, "--repeats", str(args.repeats)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {
        v: {
            "min_s": min(t for r in rs for t in r["times"]),
            "median_s": statistics.median(t for r in rs for t in r["times"]),
            "added_peak_mb": statistics.median(r["added_peak_mb"] for r in rs),
            "first_pass_added_mb": statistics.median(r["first_pass_added_mb"] for r in rs),
            "base_rss_mb": statistics.median(r["base_rss_mb"] for r in rs),
        }
        for v, rs in runs.items()
    }
    print(
        f"GPT-2-small shape (GPT2Config(), seed 0), batch 1 x {N_TOKENS} tokens, float32, 2 threads; "
        f"{args.rounds} subprocesses x (1 + {args.repeats}) passes per variant; "
        f"{'default glibc malloc' if args.default_malloc else 'mmap threshold pinned at 1 MiB'}"
    )
    print(f"{'variant':<16} {'min s':>7} {'median s':>9} {'added peak MB':>14} {'(1st pass)':>11} {'base RSS MB':>12}")
    for variant, s in summary.items():
        print(
            f"{variant:<16} {s['min_s']:>7.2f} {s['median_s']:>9.2f} {s['added_peak_mb']:>14.0f} "
            f"{s['first_pass_added_mb']:>11.0f} {s['base_rss_mb']:>12.0f}"
        )

    def ratio(key, num, den):
        return summary[num][key] / summary[den][key]

    for key in ("min_s", "median_s"):
        print(
            f"time {key}: (b)/(a) = {ratio(key, 'capture_prev', 'hf_forward'):.2f} (target <= 1.3); "
            f"(b)/(a') = {ratio(key, 'capture_prev', 'hf_trunk'):.2f}; "
            f"(b')/(a) = {ratio(key, 'capture_eager', 'hf_forward'):.2f}"
        )
    key = "added_peak_mb"
    print(
        f"added peak: (b)/(c) = {ratio(key, 'capture_prev', 'bridge_patterns'):.3f} (target <= 0.25); "
        f"(b')/(c) = {ratio(key, 'capture_eager', 'bridge_patterns'):.3f}; "
        f"(a)/(c) = {ratio(key, 'hf_forward', 'bridge_patterns'):.3f}; "
        f"(a')/(c) = {ratio(key, 'hf_trunk', 'bridge_patterns'):.3f}; "
        f"(b)/(c') = {ratio(key, 'capture_prev', 'bridge_all'):.3f}"
    )
    print(json.dumps({"summary": summary, "runs": runs}))


if __name__ == "__main__":
    main()
