"""The training loop of the tiny models: build, train with AdamW, checkpoint, log.

Data flow: recipe -> model (GPT-2 or Llama, from transformers) -> batches -> AdamW steps ->
every `checkpoint_every` steps the weights plus one log row (training_log.csv) and one row per
head (training_heads.csv). Olsson et al. 2022 (arXiv 2209.11895) saw induction heads form
abruptly in 2+ layer models; the log rows are the quantities that show it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from headlens.errors import ConfigError, OutputPathError
from headlens.files import csv_text, write_atomic
from headlens.results import Result
from headlens.training.config import TrainConfig, stages
from headlens.training.data import byte_tokenizer, load_corpus, lr_at, sample_batch
from headlens.training.evaluate import build_probes, evaluate
from headlens.training.outdir import check_run_dir, staged_run

# Columns of training_log.csv: the contract shared with the report (up to elapsed_s), then extras.
LOG_COLUMNS = [
    "step",
    "tokens_seen",
    "train_loss",
    "heldout_loss",
    "icl_score",
    "best_induction_score",
    "best_prev_token_score",
    "repeat_loss_first",
    "repeat_loss_second",
    "lr",
    "elapsed_s",
    "best_arena_induction_score",
    "needles_retrieved",
    "best_retrieval_score",
]
# Every evaluation switches the model to eager attention, the only kernel that returns patterns;
# training steps run the stage's `train_attention`.
EVAL_ATTENTION = "eager"
HEAD_COLUMNS = [
    "step",
    "layer",
    "head",
    "prev_token_score",
    "prefix_matching_score",
    "arena_induction_score",
    "retrieval_score",
]


def model_config(config: TrainConfig, tokenizer):
    """The transformers config of a recipe: GPT2Config or LlamaConfig, training attention, no dropout."""
    from transformers import GPT2Config, LlamaConfig

    bos = tokenizer.bos_token_id
    if config.arch == "gpt2":
        hf = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=config.n_ctx,
            n_embd=config.d_model,
            n_layer=config.n_layers,
            n_head=config.n_heads,
            n_inner=config.d_mlp,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=bos,
            eos_token_id=bos,
        )
    else:
        hf = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.d_model,
            intermediate_size=config.d_mlp,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.d_model // config.n_heads,
            max_position_embeddings=config.n_ctx,
            tie_word_embeddings=True,
            attention_dropout=0.0,
            bos_token_id=bos,
            eos_token_id=bos,
            pad_token_id=None,
        )
    hf._attn_implementation = config.train_attention
    return hf


def build_model(config: TrainConfig, tokenizer) -> torch.nn.Module:
    """A GPT2LMHeadModel or LlamaForCausalLM: read from `config.init_from` when set, else randomly
    initialised from config.seed."""
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaForCausalLM

    if config.init_from:
        return _quietly(
            lambda: AutoModelForCausalLM.from_pretrained(config.init_from, attn_implementation=config.train_attention)
        ).eval()
    torch.manual_seed(config.seed)
    cls = GPT2LMHeadModel if config.arch == "gpt2" else LlamaForCausalLM
    return cls(model_config(config, tokenizer)).eval()


def _write_csv(frame, path: Path) -> None:
    write_atomic(path, csv_text(frame))


def _quietly(call):
    """Run a transformers save or load without its progress bars (the library never prints)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return call()
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _prepare_stage_dir(out_dir: Path) -> Path:
    """The folder of an earlier stage, inside the run's staging folder (headlens.training.outdir)."""
    out_dir.mkdir()
    return out_dir


def train_tiny(
    out_dir,
    steps: int | None = None,
    seed: int | None = None,
    progress: bool = False,
    config: TrainConfig | None = None,
    arch: str | None = None,
    force: bool = False,
) -> Path:
    """Train a tiny model from scratch; write the model (HF format), checkpoints and the logs to out_dir.

    Runs `config` alone when given, else the stages of `arch`'s shipped recipe ("gpt2": tiny,
    "llama": tiny-gqa); `steps` is the total, shared over the stages in the recipe's
    proportion (split_steps); `seed` overrides every stage's. Stage k of n > 1 runs in
    out_dir/stage{k} and starts from stage k - 1's model; the last stage runs in out_dir itself and
    its logs continue the earlier stages' (steps counted from the start of the recipe). Every
    `checkpoint_every` steps (and at the end) the weights go to checkpoints/step_NNNNN/ and one row
    to training_log.csv (columns LOG_COLUMNS) plus one row per head to training_heads.csv
    (HEAD_COLUMNS). The final model, tokenizer and train_config.json land in out_dir itself. The run is
    written beside out_dir and moved into place when complete; out_dir must be absent, empty or an earlier
    run unless `force` (headlens.training.outdir), else OutputPathError before any work.
    Deterministic on CPU for a given seed and thread count (`config.threads`).
    """
    overrides = {"seed": seed} if seed is not None else {}
    plan = [replace(config, **overrides)] if config else list(stages(arch or "gpt2", **overrides))
    if steps is not None:
        plan = [replace(stage, steps=n) for stage, n in zip(plan, split_steps(steps, plan), strict=True)]
    out_dir = check_run_dir(out_dir, force)
    threads = torch.get_num_threads()
    previous, offset = None, 0
    try:
        with staged_run(out_dir, force) as staging:
            for index, stage in enumerate(plan, start=1):
                folder = staging if index == len(plan) else _prepare_stage_dir(staging / f"stage{index}")
                if previous is not None:
                    stage = replace(stage, init_from=str(previous))
                torch.set_num_threads(stage.threads)
                _TrainingRun(folder, stage, offset, previous).run(progress)
                previous, offset = folder, offset + stage.steps
            _name_final_paths(staging, out_dir)
    finally:
        torch.set_num_threads(threads)
    return out_dir


def _name_final_paths(staging: Path, out_dir: Path) -> None:
    """Each stage's train_config.json names the earlier stage it started from (`init_from`) where the run
    will be once moved into place, not the staging folder it was trained in."""
    for path in staging.rglob("train_config.json"):
        config = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(config.get("init_from"), str) and config["init_from"].startswith(str(staging)):
            config["init_from"] = str(out_dir) + config["init_from"][len(str(staging)) :]
            path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def split_steps(steps: int, plan: list[TrainConfig]) -> list[int]:
    """`steps` in all, shared over the stages of `plan` in the recipe's proportion (tiny: 3,000 + 600),
    each stage at least one step. ConfigError when there are fewer steps than stages."""
    if steps < len(plan):
        raise ConfigError(f"steps={steps!r} is invalid: must be at least {len(plan)}, one per stage of the recipe")
    total, shares = sum(stage.steps for stage in plan), []
    for index, stage in enumerate(plan[:-1]):
        later = len(plan) - index - 1  # stages after this one, one step each at least
        shares.append(min(max(1, round(steps * stage.steps / total)), steps - sum(shares) - later))
    return [*shares, steps - sum(shares)]


class _TrainingRun:
    """Model, optimizer, data and log of one run; `run` trains and checkpoints."""

    def __init__(self, out_dir: Path, config: TrainConfig, offset: int = 0, previous: Path | None = None):
        self.out_dir, self.config, self.offset = out_dir, config, offset
        self.tokenizer = byte_tokenizer()
        self.model, self.corpus = build_model(config, self.tokenizer), load_corpus()
        self.model.loss_type = "ForCausalLM"  # transformers' next-token loss, named so it is not guessed (and warned)
        self.probes = build_probes(self.tokenizer, config)
        self.gen = torch.Generator().manual_seed(config.seed)
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            (decay if param.dim() >= 2 and "wpe" not in name else no_decay).append(param)
        self.optim = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr,
            betas=(0.9, 0.95),
        )
        self.log_rows, self.head_rows, self.pending = [], [], []
        if previous is not None:  # the earlier stages' rows, then this stage's from its first step on
            run = load_training_log(previous)
            self.log_rows, self.head_rows = run.frame.to_dict("records"), run.tables["heads"].to_dict("records")
        self.start = time.perf_counter()

    def run(self, progress: bool) -> None:
        from tqdm.auto import tqdm

        config, model = self.config, self.model
        (self.out_dir / "train_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n", encoding="utf-8")
        if not self.log_rows:
            self.checkpoint(0)  # the random model
        bar = tqdm(range(config.steps), desc="train-tiny", unit="step", disable=not progress)
        for step in bar:
            model.train()
            for group in self.optim.param_groups:
                group["lr"] = lr_at(step, config)
            ids = sample_batch(self.corpus, config, self.gen, self.tokenizer.bos_token_id)  # [batch, n_ctx]
            loss = model(input_ids=ids, labels=ids).loss
            self.optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            self.optim.step()
            self.pending.append(loss.item())
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                self.checkpoint(step + 1)
        model.eval()
        model.set_attn_implementation(EVAL_ATTENTION)
        _quietly(lambda: model.save_pretrained(self.out_dir))
        self.tokenizer.save_pretrained(self.out_dir)

    def checkpoint(self, step: int) -> None:
        """Evaluate, save the weights, append the log rows and rewrite both CSVs atomically."""
        import pandas as pd

        config = self.config
        self.model.set_attn_implementation(EVAL_ATTENTION)
        row, heads = evaluate(self.model, self.probes, config)
        self.model.set_attn_implementation(config.train_attention)
        train_loss = sum(self.pending) / len(self.pending) if self.pending else float("nan")
        self.pending.clear()
        step += self.offset  # counted from the start of the recipe
        self.log_rows.append(
            {
                "step": step,
                "tokens_seen": step * config.batch_size * config.n_ctx,
                "train_loss": train_loss,
                **row,
                "lr": lr_at(max(step - self.offset - 1, 0), config),
                "elapsed_s": time.perf_counter() - self.start,
            }
        )
        self.head_rows.extend({"step": step, **h} for h in heads)
        _quietly(lambda: self.model.save_pretrained(self.out_dir / "checkpoints" / f"step_{step:05d}"))
        _write_csv(pd.DataFrame(self.log_rows, columns=LOG_COLUMNS), self.out_dir / "training_log.csv")
        _write_csv(pd.DataFrame(self.head_rows, columns=HEAD_COLUMNS), self.out_dir / "training_heads.csv")


def load_training_log(folder) -> Result:
    """A training run's log (a run folder written by `headlens train-tiny`, or a shipped model's folder): a Result
    of kind "training", `.frame` one row per checkpoint (LOG_COLUMNS) sorted by step, `.tables["heads"]` one row
    per head and checkpoint (HEAD_COLUMNS) sorted by step, layer and head, `.meta["folder"]` where it was read."""
    import pandas as pd

    folder = Path(folder)
    paths = [folder / "training_log.csv", folder / "training_heads.csv"]
    for path in paths:
        if not path.is_file():
            raise OutputPathError(f"{path} not found: expected a folder written by `headlens train-tiny`")
    log = pd.read_csv(paths[0]).sort_values("step").reset_index(drop=True)
    heads = pd.read_csv(paths[1]).sort_values(["step", "layer", "head"]).reset_index(drop=True)
    return Result("training", log, {"folder": str(folder)}, tables={"heads": heads})
