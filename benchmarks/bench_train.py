"""Training speed of both tiny-model recipes, and what their shipped runs took.

Run by hand: `.venv/bin/python benchmarks/bench_train.py [--steps 20]`.
Prints one markdown table for BENCHMARKS.md:
- tokens/s of one training step (forward + backward + AdamW) of each recipe (`recipe("gpt2")` ->
  tiny, `recipe("llama")` -> tiny-gqa) at 1 and 2 torch threads (same batches, same weights);
- each shipped run's wall time and tokens/s, read from its training log (evaluation included),
  and the step of its induction phase change (headlens.reports.figures.phase_change_step: the best
  induction score rises from < 0.2 to > 0.5 within a fifth of training).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from headlens.files import shipped_path
from headlens.reports.figures import phase_change_step
from headlens.training import byte_tokenizer, load_corpus, load_training_log, recipe, sample_batch
from headlens.training.loop import build_model

SHIPPED = {"gpt2": "tiny", "llama": "tiny-gqa"}  # recipe -> shipped model


def time_training_steps(arch: str, threads: int, steps: int) -> float:
    """Median seconds per training step of an architecture's recipe at `threads` threads."""
    torch.set_num_threads(threads)
    config = recipe(arch)
    tokenizer = byte_tokenizer()
    model = build_model(config, tokenizer).train()
    optim = torch.optim.AdamW(model.parameters(), lr=config.lr)
    corpus, gen = load_corpus(), torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps + 2):  # two warm-up steps are dropped
        ids = sample_batch(corpus, config, gen)  # [batch, n_ctx]
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def stage_walls(log) -> list[float]:
    """Wall seconds of each stage of a run: `elapsed_s` restarts at every stage."""
    elapsed = log["elapsed_s"].tolist()
    ends = [i for i in range(len(elapsed) - 1) if elapsed[i + 1] < elapsed[i]] + [len(elapsed) - 1]
    return [elapsed[i] for i in ends]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print("| measurement | value |\n| --- | --- |")
    for arch, name in SHIPPED.items():
        config = recipe(arch)
        tokens = config.batch_size * config.n_ctx
        for threads in (1, 2):
            seconds = time_training_steps(arch, threads, args.steps)
            print(
                f"| {name} recipe ({arch}): training step, {threads} thread(s), batch {config.batch_size} x "
                f"{config.n_ctx} | {seconds * 1000:.0f} ms, {tokens / seconds:,.0f} tokens/s |"
            )
        log = load_training_log(shipped_path(name)).frame
        last = log.iloc[-1]
        wall = stage_walls(log)
        print(
            f"| {name} shipped run: {int(last.step)} steps, {int(last.tokens_seen):,} tokens, "
            f"{len(wall)} stage(s) | {sum(wall):.0f} s wall ({' + '.join(f'{w:.0f}' for w in wall)}), "
            f"{last.tokens_seen / sum(wall):,.0f} tokens/s (evaluation included) |"
        )
        print(f"| {name} shipped run: induction phase change (step) | {phase_change_step(log)} |")


if __name__ == "__main__":
    main()
