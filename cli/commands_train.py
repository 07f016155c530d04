"""`headlens train-tiny`: train an embedded tiny model and watch its induction heads form."""

from __future__ import annotations

import click

from headlens.cli.options import SEED, out_dir_option, progress_option


@click.command("train-tiny")
@click.option(
    "--arch",
    type=click.Choice(["gpt2", "llama"]),
    default="gpt2",
    show_default=True,
    help="gpt2: the recipe of `tiny`; llama: the recipe of `tiny-gqa` (rotary, RMSNorm, SwiGLU, "
    "8 query heads over 2 key/value heads)",
)
@click.option("--steps", type=int, default=None, help="optimizer steps (default: the shipped model's recipe)")
@out_dir_option(
    "out_dir",
    type=click.Path(file_okay=False),
    default="tiny-run",
    show_default=True,
    help="run folder: model, checkpoints/, training_log.csv, training_heads.csv",
)
@click.option("--seed", type=SEED, default=None, help="seed of weights, data order and probes (default: 0)")
@click.option(
    "--force",
    is_flag=True,
    help="write into an --out-dir that holds other files (files of the run's names are replaced); "
    "without it only an absent or empty folder or an earlier run is written",
)
@progress_option
def train_tiny_command(
    arch: str, steps: int | None, out_dir: str, seed: int | None, force: bool, progress: bool
) -> None:
    """Train a small byte-level model (KJV text + synthetic copying episodes) on CPU.

    Every checkpoint logs held-out loss, the in-context-learning score, every head's
    previous-token, induction and retrieval scores (Olsson et al. 2022; Wu et al. 2024) and
    the needle tests retrieved: the induction-head phase change shows up in OUT/training_log.csv.
    """
    import time

    from headlens.training import load_training_log, train_tiny

    start = time.perf_counter()
    folder = train_tiny(out_dir, steps=steps, seed=seed, progress=progress, arch=arch, force=force)
    log = load_training_log(folder).frame
    last = log.iloc[-1]
    click.echo(f"trained {int(last['step'])} steps in {time.perf_counter() - start:.0f} s -> {folder}")
    click.echo(
        f"held-out loss {last['heldout_loss']:.3f}, ICL score {last['icl_score']:.3f}, "
        f"best induction score {last['best_induction_score']:.2f}, "
        f"best previous-token score {last['best_prev_token_score']:.2f}, "
        f"needles retrieved {int(last['needles_retrieved'])}"
    )


COMMANDS = [train_tiny_command]
