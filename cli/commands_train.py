"""`headlens train-tiny`: train the embedded tiny GPT-2 and watch its induction heads form."""

from __future__ import annotations

import click
from headlens.cli.options import progress_option


@click.command("train-tiny")
@click.option("--steps", type=int, default=None, help="optimizer steps (default: the shipped model's recipe)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="tiny-run", show_default=True,
              help="run folder: model, checkpoints/, training_log.csv, training_heads.csv")
@click.option("--seed", type=int, default=None, help="seed of weights, data order and probes (default: 0)")
@progress_option
def train_tiny_command(steps: int | None, out_dir: str, seed: int | None, progress: bool) -> None:
    """Train a small GPT-2 (byte-level, KJV text + repeated random segments) on CPU.

    Every checkpoint logs held-out loss, the in-context-learning score and every head's
    previous-token and induction scores (Olsson et al. 2022): the induction-head phase
    change shows up in OUT/training_log.csv.
    """
    import time

    from headlens.train import load_training_log, train_tiny

    start = time.perf_counter()
    folder = train_tiny(out_dir, steps=steps, seed=seed, progress=progress)
    log, _ = load_training_log(folder)
    last = log.iloc[-1]
    click.echo(f"trained {int(last['step'])} steps in {time.perf_counter() - start:.0f} s -> {folder}")
    click.echo(f"held-out loss {last['heldout_loss']:.3f}, ICL score {last['icl_score']:.3f}, "
               f"best induction score {last['best_induction_score']:.2f}, "
               f"best previous-token score {last['best_prev_token_score']:.2f}")


COMMANDS = [train_tiny_command]
