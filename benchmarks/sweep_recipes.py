"""Many tiny-model recipes at once, one process each, to see which mixes grow induction heads.

An exploration tool, not a recipe: each run is `headlens.training.train_tiny` on one variant of the
`tiny-gqa` shape (GRID below), with its training and evaluation moved to CUDA when a GPU is present
(GPU floats are not the CPU's, so a run here guides the choice of a recipe; the shipped weights come
from a CPU run of the chosen recipe). Checkpoint weights are not written: only each run's
training_log.csv and training_heads.csv. Every run stops at its first checkpoint after DEADLINE_S
seconds, so the logs hold however many steps the machine allowed.

    python benchmarks/sweep_recipes.py OUT_DIR DEADLINE_S      (a GPU machine: all runs at once)
    python benchmarks/sweep_recipes.py --summary OUT_DIR       (one line per run, for BENCHMARKS.md)
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The tiny-gqa shape at lr 2e-3, 75% repeat episodes, no needles; each entry changes a few fields.
BASE = {
    "arch": "llama",
    "n_heads": 8,
    "n_kv_heads": 2,
    "d_mlp": 384,
    "steps": 6000,
    "checkpoint_every": 50,
    "train_attention": "sdpa",
    "lr": 2e-3,
    "repeat_share": 0.75,
    "needle_share": 0.0,
    "decay_share": 0.0,
}
GRID = {
    "a_lr1e3": {"lr": 1e-3},
    "b_lr2e3": {},
    "c_lr3e3": {"lr": 3e-3},
    "d_rep90": {"repeat_share": 0.9},
    "e_4q2kv": {"n_heads": 4},
    "f_4q1kv": {"n_heads": 4, "n_kv_heads": 1},
    "g_d256": {"d_model": 256, "d_mlp": 768, "lr": 1e-3},
    "h_3layer": {"n_layers": 3},
    "i_rep55_needle30": {"repeat_share": 0.55, "needle_share": 0.3},
    "j_seg32": {"segment_max": 32},
    "k_printable": {"printable_share": 1.0},
    "l_8q4kv": {"n_kv_heads": 4},
    "m_wd01": {"weight_decay": 0.1, "warmup_steps": 200},
    "n_needle15": {"needle_share": 0.15},
    "o_seed1": {"seed": 1},
    "p_lr5e3": {"lr": 5e-3},
}
RUNS = {name: {**BASE, **change} for name, change in GRID.items()}
RUNS["z_gpt2_tiny_stage1"] = {"steps": 3000, "checkpoint_every": 50}  # tiny's first stage: a GPU-vs-CPU check


def _on_device(deadline_s: float) -> None:
    """Route the training loop's batches, evaluations and model to CUDA (when present); stop after the deadline."""
    import torch

    from headlens.training import evaluate, loop

    device = "cuda" if torch.cuda.is_available() else "cpu"
    build, sample = loop.build_model, loop.sample_batch
    loop.build_model = lambda config, tokenizer: build(config, tokenizer).to(device)
    loop.sample_batch = lambda *args, **kwargs: sample(*args, **kwargs).to(device)
    run_eager = evaluate.run_eager
    evaluate.run_eager = lambda model, ids: tuple(t.cpu() for t in run_eager(model, ids.to(device)))
    decode = evaluate._decode_needle

    def decode_on_device(model, test):
        # the CPU decoder indexes prompt ids with each head's argmax key: hand it CPU logits and patterns
        forward = model.forward

        def cpu_outputs(*args, **kwargs):
            kwargs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
            out = forward(*args, **kwargs)
            out.logits, out.attentions = out.logits.cpu(), tuple(a.cpu() for a in out.attentions)
            return out

        model.forward = cpu_outputs
        try:
            return decode(model, test)
        finally:
            del model.forward

    evaluate._decode_needle = decode_on_device
    start, checkpoint = time.time(), loop._TrainingRun.checkpoint

    def checkpoint_until_deadline(self, step):
        checkpoint(self, step)
        if time.time() - start > deadline_s:
            raise SystemExit(0)

    loop._TrainingRun.checkpoint = checkpoint_until_deadline
    loop._quietly = lambda call: None  # no weights written: the logs are the result


def _one(out: str, config: dict, deadline_s: float) -> None:
    import torch

    from headlens.training import TrainConfig
    from headlens.training.loop import train_tiny

    torch.set_num_threads(1)
    _on_device(deadline_s)
    train_tiny(out, config=TrainConfig(**config))


def summary(out_dir: Path) -> None:
    print(
        "| run | last step | best previous-token score | best ARENA induction | needles retrieved | "
        "first step with ARENA >= 0.3 |\n|---|---|---|---|---|---|"
    )
    for name in RUNS:
        path = out_dir / name / "training_log.csv"
        if not path.is_file():
            continue
        rows = list(csv.DictReader(path.open()))
        last = rows[-1]
        formed = [int(r["step"]) for r in rows if float(r["best_arena_induction_score"]) >= 0.3]
        print(
            f"| {name} | {last['step']} | {float(last['best_prev_token_score']):.2f} | "
            f"{float(last['best_arena_induction_score']):.2f} | {last['needles_retrieved']}/15 | "
            f"{formed[0] if formed else 'none'} |"
        )


def main() -> None:
    if sys.argv[1] == "--one":
        _one(sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4]))
        return
    if sys.argv[1] == "--summary":
        summary(Path(sys.argv[2]))
        return
    out_dir, deadline_s = Path(sys.argv[1]), sys.argv[2]
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, config in RUNS.items():
        with (out_dir / f"{name}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--one", str(out_dir / name), json.dumps(config), deadline_s],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
            )
    for proc in procs:
        proc.wait()
    summary(out_dir)


if __name__ == "__main__":
    main()
