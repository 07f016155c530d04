"""How the CI of an ablation widens as its token budget falls, and what each budget costs (SmolLM2 by default).

For each budget (`--tokens`, "all" for every token) the same heads are ablated on the default text
(headlens.ablation.ablate_heads, zero ablation, loss metric), the clean run computed (a fresh cache
per budget) and timed: delta, 95% CI and its width, the windows read, wall and CPU seconds. Then the
same budget again with the clean run cached. One process, one load of the model.

Run: .venv/bin/python benchmarks/bench_ablate_budget.py [--model smollm2] [--heads 3.4,5.1]
     [--tokens 1024 2048 4096 8192 all]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", default="3.4,5.1")
    parser.add_argument("--tokens", nargs="+", default=["1024", "2048", "4096", "8192"])
    args = parser.parse_args()

    from headlens.ablation.ablate import ablate_heads
    from headlens.load.models import load_model

    loaded = load_model(args.model)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.model}, heads {args.heads}, zero ablation, loss")
    print("| budget | windows | tokens read | delta | 95% CI | CI width | cold wall s | cold CPU s | cached wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["HEADLENS_CACHE"] = cache
            run = lambda tokens=tokens: ablate_heads(loaded, args.heads, tokens=tokens).meta  # noqa: E731
            cold, wall, cpu = timed(run)
            warm, wall_warm, _ = timed(run)
        assert warm == cold
        low, high = cold["ci95"]
        windows = cold["data"].split(" sequences")[0] if " of " in cold["data"].split(":")[0] else "all"
        print(
            f"| {tokens} | {windows} | {cold['tokens_read']:,} | {cold['delta']:+.5f} | [{low:+.5f}, {high:+.5f}] "
            f"| {high - low:.5f} | {wall:.1f} | {cpu:.1f} | {wall_warm:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
