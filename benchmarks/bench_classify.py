"""Classify scores vs TransformerLens detect_head, side by side on the GPT-2-small shape.

  ours  headlens: every pattern score classify computes for all 144 heads in one streamed pass
        (prev/current/first-token, Voita argmax offset, duplicate-token, prefix matching with its
        "mul" form, copying from z through W_O and the unembedding), no logits, no cache
  tl    three `transformer_lens.head_detector.detect_head` calls (previous_token_head,
        duplicate_token_head, induction_head) on the same prompts: each runs run_with_cache per
        prompt and loops head by head

Same token sequences: N_PROMPTS passages of the tiny model's held-out text, each repeated twice
(so duplicate and induction targets exist), BOS prepended as detect_head's to_tokens does; the
child running TL checks to_tokens gives exactly these ids. The numbers are compared: our
mul-form previous-token / duplicate / induction scores against detect_head's (max |diff|).

Memory: each side in a fresh subprocess, model (and bridge) built first, one warm-up pass, then
the kernel's RSS high-water mark is reset (`echo 5 > /proc/self/clear_refs`) and the side runs
`--repeats` times; added peak = VmHWM - VmRSS at the reset. `--rounds` fresh subprocess pairs,
sides alternated; figures are medians over them (time: over all passes). By default each child
runs with glibc's mmap threshold pinned at 1 MiB (as in bench_capture.py): tensors of 1 MiB or
more are unmapped when they die, so memory the warm-up pass freed cannot hide a later pass's
peak. The pinned allocator pays a page fault per fresh mapping, which slows both sides (ours
more: it makes and frees many mid-sized blocks), so time is quoted from a `--default-malloc` run.

    .venv/bin/python benchmarks/bench_classify.py --rounds 3 --repeats 2 [--batch B] [--default-malloc]
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

N_PROMPTS = 8
PASSAGE_CHARS = 600  # ~130 GPT-2 tokens per copy: 2 copies + BOS stay well under n_ctx
BATCH = 1  # default sequences per forward: detect_head runs one prompt at a time
# glibc: pin the mmap threshold (as benchmarks/bench_capture.py does, see there) so the RSS peak
# follows live tensors rather than the allocator's history; --default-malloc leaves it alone.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576"}


def prompts() -> list[str]:
    from headlens.probes.inputs import default_text

    text = default_text()
    return [text[i * PASSAGE_CHARS : (i + 1) * PASSAGE_CHARS] * 2 for i in range(N_PROMPTS)]


def _ours(loaded, sequences, batch_size: int):
    import torch

    from headlens.capture import iter_batches
    from headlens.classify.runs import stream_heads
    from headlens.scores.copying import CopyingReducer
    from headlens.scores.duplicate import duplicate_token_reducer
    from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
    from headlens.scores.positional import (
        ArgmaxOffsetReducer,
        current_token_reducer,
        first_token_reducer,
        prev_token_reducer,
    )

    n, h = loaded.spec.n_layers, loaded.spec.n_heads

    def step():
        prev, dup, prefix = prev_token_reducer(n, h), duplicate_token_reducer(n, h), prefix_matching_reducer(n, h)
        others = [
            current_token_reducer(n, h),
            first_token_reducer(n, h),
            ArgmaxOffsetReducer(n, h),
            CopyingReducer(loaded.model, lambda b: prefix_matching_targets(b.input_ids).any(-1)),
        ]
        batches = iter_batches(sequences, batch_size, pad_id=loaded.bos_token_id)
        stream_heads(loaded.model, batches, [prev, dup, prefix, *others])
        return {
            "previous_token_head": prev.mul_score(),
            "duplicate_token_head": dup.mul_score(),
            "induction_head": prefix.mul_score(),
            "copying": others[-1].result(),
        }

    torch.set_num_threads(2)
    return step


def _tl(loaded, sequences, texts):
    import torch
    from transformer_lens.head_detector import detect_head

    from headlens.load.models import boot_bridge

    bridge = boot_bridge(loaded)
    for text, seq in zip(texts, sequences, strict=True):
        assert bridge.to_tokens(text)[0].tolist() == seq, "detect_head would see other tokens"

    def step():
        with torch.no_grad():
            return {
                name: detect_head(bridge, texts, name)
                for name in ("previous_token_head", "duplicate_token_head", "induction_head")
            }

    return step


def run_side(side: str, repeats: int, batch_size: int = BATCH) -> dict:
    import torch

    from headlens.load.models import build_model

    torch.set_num_threads(2)
    loaded = build_model(None, seed=0)  # GPT2Config(): 12 layers x 12 heads, d_model 768, random weights
    texts = prompts()
    sequences = [[loaded.bos_token_id] + loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    step = _ours(loaded, sequences, batch_size) if side == "ours" else _tl(loaded, sequences, texts)
    if side == "tl":
        del loaded  # the bridge holds its own copy: one set of weights on each side
    step()  # warm-up
    base_kb = reset_peak()
    times, scores = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        scores = step()
        times.append(time.perf_counter() - start)
    return {
        "side": side,
        "seconds": statistics.median(times),
        "times": times,
        "added_peak_mb": (status_kb("VmHWM") - base_kb) / 1024,
        "base_rss_mb": base_kb / 1024,
        "tokens": [len(s) for s in sequences],
        "scores": {k: v.tolist() for k, v in scores.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per side")
    parser.add_argument("--rounds", type=int, default=3, help="fresh subprocess pairs (medians over them)")
    parser.add_argument("--batch", type=int, default=BATCH, help="our sequences per forward pass")
    parser.add_argument(
        "--default-malloc", action="store_true", help="leave glibc's dynamic mmap threshold alone (noisier peaks)"
    )
    parser.add_argument("--side", choices=["ours", "tl"], help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.repeats, args.batch)))
        return
    import torch

    env = dict(os.environ) if args.default_malloc else {**os.environ, **CHILD_ENV}
    runs: dict[str, list[dict]] = {"ours": [], "tl": []}
    for _ in range(args.rounds):  # fresh subprocesses, sides alternated, so load changes hit both
        for side in ("ours", "tl"):
            out = subprocess.run(
                [sys.executable, __file__, "--side", side, "--repeats", str(args.repeats), "--batch", str(args.batch)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    ours, tl = runs["ours"][0], runs["tl"][0]
    diffs = {
        name: (torch.tensor(ours["scores"][name]) - torch.tensor(tl["scores"][name])).abs().max().item()
        for name in tl["scores"]
    }
    med = {
        side: {
            "seconds": statistics.median(t for r in rs for t in r["times"]),
            "peak": statistics.median(r["added_peak_mb"] for r in rs),
        }
        for side, rs in runs.items()
    }
    print(
        f"GPT-2-small shape (GPT2Config(), seed 0, random weights), {N_PROMPTS} prompts of "
        f"{min(ours['tokens'])}-{max(ours['tokens'])} tokens, float32, 2 threads, {args.rounds} rounds x "
        f"{args.repeats} passes, our batch {args.batch}, "
        f"{'default malloc' if args.default_malloc else 'mmap threshold 1 MiB'}"
    )
    print(f"{'side':<6} {'median s':>9} {'median peak MB':>15}  per round: seconds / added peak MB")
    for side, rs in runs.items():
        print(
            f"{side:<6} {med[side]['seconds']:>9.2f} {med[side]['peak']:>15.0f}  "
            + ", ".join(f"{statistics.median(r['times']):.2f} / {r['added_peak_mb']:.0f}" for r in rs)
        )
    print(
        f"speed-up tl/ours = {med['tl']['seconds'] / med['ours']['seconds']:.2f}x (target >= 3); "
        f"added peak ours/tl = {med['ours']['peak'] / med['tl']['peak']:.3f} (target <= 0.5)"
    )
    print("max |ours mul - detect_head|: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))


if __name__ == "__main__":
    main()
