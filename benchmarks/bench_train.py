"""Training speed of the tiny-model recipe and forward time of the shipped model.

Run by hand: `.venv/bin/python benchmarks/bench_train.py [--steps 20] [--repeats 20]`.
Prints one markdown table for BENCHMARKS.md:
- tokens/s of one training step (forward + backward + AdamW) of the default TrainConfig, at 1 and
  2 torch threads side by side (same batches, same weights);
- one forward pass of the shipped model (`load_model("tiny")`) on a full 256-token context,
  batch 1, in eager attention (what headlens captures from) and sdpa;
- the shipped run's wall time and tokens/s, read from its training log.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def time_training_steps(threads: int, steps: int) -> float:
    """Median seconds per training step of the default recipe at `threads` threads."""
    from headlens.models import build_model
    from headlens.train import TrainConfig, _gpt2_config, byte_tokenizer, load_corpus, sample_batch

    torch.set_num_threads(threads)
    config = TrainConfig()
    tokenizer = byte_tokenizer()
    model = build_model(_gpt2_config(config, tokenizer), seed=0, tokenizer=tokenizer).model.train()
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


def time_forward(attn: str, repeats: int) -> float:
    """Median seconds of one no-grad forward of the shipped model on [1, n_ctx] tokens."""
    from headlens.models import load_model

    loaded = load_model("tiny")
    loaded.model.config._attn_implementation = attn
    ids = torch.randint(0, 256, (1, loaded.spec.n_ctx))  # [batch, pos]
    times = []
    with torch.no_grad():
        for _ in range(repeats + 2):
            start = time.perf_counter()
            loaded.model(input_ids=ids)
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from headlens.models import shipped_path
    from headlens.train import TrainConfig, load_training_log

    config = TrainConfig()
    tokens = config.batch_size * config.n_ctx
    print("| measurement | value |\n| --- | --- |")
    step = {threads: time_training_steps(threads, args.steps) for threads in (1, 2)}
    for threads, seconds in step.items():
        print(f"| training step, {threads} thread(s), batch {config.batch_size} x {config.n_ctx} | "
              f"{seconds * 1000:.0f} ms, {tokens / seconds:,.0f} tokens/s |")
    print(f"| ratio 1 thread / 2 threads (step time) | {step[1] / step[2]:.2f} |")
    torch.set_num_threads(2)
    fwd = {attn: time_forward(attn, args.repeats) for attn in ("eager", "sdpa")}
    for attn, seconds in fwd.items():
        print(f"| forward of the shipped model, 1 x {config.n_ctx} tokens, {attn} | {seconds * 1000:.2f} ms |")
    print(f"| ratio eager / sdpa (forward) | {fwd['eager'] / fwd['sdpa']:.2f} |")
    log, _ = load_training_log(shipped_path("tiny"))
    last = log.iloc[-1]
    print(f"| shipped run: {int(last.step)} steps, {int(last.tokens_seen):,} tokens | {last.elapsed_s:.0f} s wall, "
          f"{last.tokens_seen / last.elapsed_s:,.0f} tokens/s (evaluation included) |")


if __name__ == "__main__":
    main()
