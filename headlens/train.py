"""Train the embedded tiny GPT-2 on CPU and watch its induction heads form.

A real `transformers.GPT2LMHeadModel` (so every headlens code path is GPT-2's), a byte-level
tokenizer, public-domain English (the King James Bible from Debian's `bible-kjv-text`, see
data/tiny/CORPUS.md) mixed with repeated random segments. Olsson et al. 2022 (arXiv
2209.11895) saw induction heads form abruptly in 2+ layer models, with in-context learning
improving at the same time; every checkpoint logs the quantities that show it.
Data flow: corpus -> batches -> AdamW steps -> checkpoint (weights + one log row per checkpoint).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from headlens.files import write_atomic

# Columns of training_log.csv (contract shared with the report engineer), then extras.
LOG_COLUMNS = ["step", "tokens_seen", "train_loss", "heldout_loss", "icl_score", "best_induction_score",
               "best_prev_token_score", "repeat_loss_first", "repeat_loss_second", "lr", "elapsed_s"]
HEAD_COLUMNS = ["step", "layer", "head", "prev_token_score", "prefix_matching_score"]
CORPUS_FILE = "kjv_train.txt.gz"  # training text, held out books removed (data/tiny/CORPUS.md)
BOS_TOKEN = "<|endoftext|>"  # id 256, after the 256 byte tokens
PRINTABLE = (32, 127)  # printable ASCII byte ids [low, high): "looks like text" random segments


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of the tiny-model recipe. Defaults are the shipped model's run."""

    steps: int = 3000  # optimizer steps
    seed: int = 0  # seeds weights, data order, synthetic episodes and probes
    n_layers: int = 2  # transformer blocks (induction needs >= 2: Olsson et al.)
    n_heads: int = 4  # heads per block
    d_model: int = 128  # residual width; d_head = d_model / n_heads = 32
    n_ctx: int = 256  # context length, BOS included
    batch_size: int = 16  # sequences per step (16 x 256 tokens)
    lr: float = 1e-3  # peak learning rate (AdamW); 3e-3 kept this size on the plateau (model card)
    warmup_steps: int = 50  # linear warmup from 0
    decay_share: float = 0.2  # the last share of steps decays lr linearly to lr * final_lr_share
    final_lr_share: float = 0.1  # lr at the last step, as a share of the peak
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # max global grad norm
    repeat_share: float = 0.75  # share of sequences that are repeated-random-segment episodes
    printable_share: float = 0.5  # share of those segments drawn from printable ASCII (else any byte)
    segment_min: int = 8  # shortest repeated segment (tokens)
    segment_max: int = 64  # longest repeated segment (tokens)
    checkpoint_every: int = 25  # steps between checkpoints (weights + log row)
    eval_windows: int = 16  # held-out windows of n_ctx tokens per evaluation
    probe_seqs: int = 16  # repeated-random-token probe sequences per evaluation
    probe_seq_len: int = 100  # length of each copy in [BOS, c, c]; 1 + 2 * len <= n_ctx
    probe_seed: int = 1234  # the probe set is fixed across checkpoints and seeds
    threads: int = 1  # torch CPU threads (determinism holds for a fixed count; 1 wastes least on a busy machine)

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str):
            if not ok:
                from headlens.errors import ConfigError

                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: must be {rule}")

        for name in ("steps", "n_layers", "n_heads", "batch_size", "checkpoint_every", "eval_windows",
                     "probe_seqs", "threads"):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.seed >= 0, "seed", ">= 0")
        need(self.d_model % self.n_heads == 0, "d_model", f"a multiple of n_heads ({self.n_heads})")
        need(self.lr > 0, "lr", "> 0")
        need(self.warmup_steps >= 0, "warmup_steps", ">= 0")
        for name in ("decay_share", "final_lr_share", "repeat_share", "printable_share"):
            need(0 <= getattr(self, name) <= 1, name, "in [0, 1]")
        need(2 <= self.segment_min <= self.segment_max, "segment_min", f"in [2, segment_max={self.segment_max}]")
        need(self.segment_max <= (self.n_ctx - 1) // 2, "segment_max", f"<= (n_ctx - 1) // 2 = {(self.n_ctx - 1) // 2}")
        need(2 <= self.probe_seq_len <= (self.n_ctx - 1) // 2, "probe_seq_len",
             f"in [2, (n_ctx - 1) // 2 = {(self.n_ctx - 1) // 2}]")


# 1) tokenizer and corpus ----------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map (Radford et al. 2019), as the ByteLevel alphabet."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A byte-level tokenizer in Hugging Face format: token id = UTF-8 byte value, BOS = 256.

    No merges: 257 tokens keep the unembedding small (the GPT-2 vocabulary would dominate CPU
    time), and every byte string round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    vocab[BOS_TOKEN] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=BOS_TOKEN,
                                   unk_token=BOS_TOKEN)


def load_corpus() -> torch.Tensor:
    """The training text as byte ids: [n_tokens] uint8 (the byte tokenizer's ids)."""
    from headlens.models import shipped_path

    raw = gzip.decompress((shipped_path("tiny") / CORPUS_FILE).read_bytes())
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


# 2) batches -----------------------------------------------------------------------------

def sample_batch(corpus: torch.Tensor, config: TrainConfig, gen: torch.Generator, bos_id: int = 256) -> torch.Tensor:
    """[batch, n_ctx] ids: BOS + a random text window; a `repeat_share` of rows instead hold a short
    text prefix followed by one random segment repeated to the end (induction fodder)."""
    body = config.n_ctx - 1
    starts = torch.randint(0, len(corpus) - body, (config.batch_size,), generator=gen)  # [batch]
    rows = torch.stack([corpus[s : s + body].long() for s in starts.tolist()])  # [batch, body]
    episode = torch.rand(config.batch_size, generator=gen) < config.repeat_share  # [batch]
    for row in episode.nonzero()[:, 0].tolist():
        length = int(torch.randint(config.segment_min, config.segment_max + 1, (1,), generator=gen))
        prefix = int(torch.randint(0, body // 4 + 1, (1,), generator=gen))
        low, high = PRINTABLE if torch.rand(1, generator=gen).item() < config.printable_share else (0, 256)
        segment = torch.randint(low, high, (length,), generator=gen)  # [length]
        reps = -(-(body - prefix) // length)
        rows[row, prefix:] = segment.repeat(reps)[: body - prefix]
    bos = torch.full((config.batch_size, 1), bos_id, dtype=torch.long)  # [batch, 1]
    return torch.cat([bos, rows], dim=1)  # [batch, n_ctx]


def lr_at(step: int, config: TrainConfig) -> float:
    """Warmup, hold at the peak, then linear decay over the last `decay_share` of steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_start = config.steps * (1 - config.decay_share)
    if step < decay_start or config.decay_share == 0:
        return config.lr
    frac = (step - decay_start) / max(1.0, config.steps - decay_start)
    return config.lr * (1 - frac * (1 - config.final_lr_share))


# 3) evaluation per checkpoint -------------------------------------------------------------

def build_probes(tokenizer, config: TrainConfig) -> dict:
    """Fixed evaluation inputs: held-out text windows and [BOS, c, c] repeated random tokens."""
    from headlens.probes import default_text, repeated_random_tokens, text_windows

    windows = text_windows(tokenizer, default_text(), config.n_ctx, tokenizer.bos_token_id,
                           max_windows=config.eval_windows)
    windows = torch.tensor([w for w in windows if len(w) == config.n_ctx])  # [n_windows, n_ctx]
    repeat = repeated_random_tokens(config.probe_seqs, config.probe_seq_len, 2, *PRINTABLE,
                                    tokenizer.bos_token_id, seed=config.probe_seed)  # [n_seq, 1 + 2 * len]
    return {"windows": windows, "repeat": repeat}


def _capture_losses(model, ids: torch.Tensor, reducers, batch_size: int = 16) -> torch.Tensor:
    """One no-grad pass over ids [n, pos]: feeds the reducers and returns token losses [n, pos - 1]."""
    from headlens.ablation.ablate import token_losses
    from headlens.capture import capture_hooks, forward, iter_batches

    losses, batch_ref = [], [None]
    with torch.no_grad(), capture_hooks(model, reducers, batch_ref):
        for batch in iter_batches(ids, batch_size):
            batch_ref[0] = batch
            losses.append(token_losses(forward(model, batch), batch.input_ids, batch.mask))
    return torch.cat(losses)  # [n, pos - 1]


def evaluate(model, probes: dict, config: TrainConfig) -> tuple[dict, list[dict]]:
    """One log row (losses, ICL score, best head scores) and one row per head."""
    from headlens.scores.icl import copy_losses, icl_score, second_copy_induction_reducer
    from headlens.scores.positional import prev_token_reducer

    model.eval()
    n_layers, n_heads = model.config.n_layer, model.config.n_head
    prev = prev_token_reducer(n_layers, n_heads)
    induction = second_copy_induction_reducer(n_layers, n_heads, config.probe_seq_len)
    text_losses = _capture_losses(model, probes["windows"], [prev])  # [n_windows, n_ctx - 1]
    rep_losses = _capture_losses(model, probes["repeat"], [induction])  # [n_seq, 2 * probe_seq_len]
    first, second = copy_losses(rep_losses, config.probe_seq_len)
    prev_scores, ind_scores = prev.result(), induction.result()  # [n_layers, n_heads] each
    row = {"heldout_loss": float(text_losses.double().nanmean()), "icl_score": icl_score(text_losses, config.n_ctx),
           "best_induction_score": float(ind_scores.max()), "best_prev_token_score": float(prev_scores.max()),
           "repeat_loss_first": first, "repeat_loss_second": second}
    heads = [{"layer": layer, "head": head, "prev_token_score": float(prev_scores[layer, head]),
              "prefix_matching_score": float(ind_scores[layer, head])}
             for layer in range(n_layers) for head in range(n_heads)]
    return row, heads


# 4) the loop ------------------------------------------------------------------------------

def _write_csv(frame, path: Path) -> None:
    write_atomic(path, frame.to_csv(index=False))


def _save_quietly(save) -> None:
    """Run a transformers save without its shard progress bar (the library never prints)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        save()
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _prepare_out_dir(out_dir) -> Path:
    """Create the run folder; refuse a file, or a folder that already holds a run (nothing is lost)."""
    from headlens.errors import OutputPathError

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputPathError(f"--out {out_dir} is a file: give a folder for the training run")
    if (out_dir / "training_log.csv").exists():
        raise OutputPathError(f"--out {out_dir} already holds a training run: choose a new folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create --out {out_dir}: {exc.strerror}") from None
    return out_dir


def _gpt2_config(config: TrainConfig, tokenizer):
    from transformers import GPT2Config

    return GPT2Config(vocab_size=len(tokenizer), n_positions=config.n_ctx, n_embd=config.d_model,
                      n_layer=config.n_layers, n_head=config.n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.bos_token_id)


def train_tiny(out_dir, steps: int | None = None, seed: int | None = None, progress: bool = False,
               config: TrainConfig | None = None) -> Path:
    """Train a tiny GPT-2 from scratch; write the model (HF format), checkpoints and the logs to out_dir.

    `steps` and `seed` override the config's. Every `checkpoint_every` steps (and at the end)
    the weights go to out_dir/checkpoints/step_NNNNN/ and one row to training_log.csv
    (columns LOG_COLUMNS) plus one row per head to training_heads.csv (HEAD_COLUMNS). The
    final model, tokenizer and train_config.json land in out_dir itself.
    Deterministic on CPU for a given seed and thread count.
    """
    config = config or TrainConfig()
    config = replace(config, **{k: v for k, v in (("steps", steps), ("seed", seed)) if v is not None})
    out_dir = _prepare_out_dir(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        _TrainingRun(out_dir, config).run(progress)
    finally:
        torch.set_num_threads(threads)
    return out_dir


class _TrainingRun:
    """Model, optimizer, data and log of one run; `run` trains and checkpoints."""

    def __init__(self, out_dir: Path, config: TrainConfig):
        from headlens.models import build_model

        self.out_dir, self.config = out_dir, config
        self.tokenizer = byte_tokenizer()
        loaded = build_model(_gpt2_config(config, self.tokenizer), seed=config.seed, tokenizer=self.tokenizer,
                             name="tiny")
        self.model, self.corpus = loaded.model, load_corpus()
        self.probes = build_probes(self.tokenizer, config)
        self.gen = torch.Generator().manual_seed(config.seed)
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            (decay if param.dim() >= 2 and "wpe" not in name else no_decay).append(param)
        self.optim = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                        {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
        self.log_rows, self.head_rows, self.pending = [], [], []
        self.start = time.perf_counter()

    def run(self, progress: bool) -> None:
        from tqdm.auto import tqdm

        from headlens.models import LoadedModel, save_model, spec_of

        config, model = self.config, self.model
        (self.out_dir / "train_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n", encoding="utf-8")
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
        final = LoadedModel(model=model, tokenizer=self.tokenizer, spec=spec_of(model), name="tiny")
        _save_quietly(lambda: save_model(final, self.out_dir))

    def checkpoint(self, step: int) -> None:
        """Evaluate, save the weights, append the log rows and rewrite both CSVs atomically."""
        import pandas as pd

        config = self.config
        row, heads = evaluate(self.model, self.probes, config)
        train_loss = sum(self.pending) / len(self.pending) if self.pending else float("nan")
        self.pending.clear()
        self.log_rows.append({"step": step, "tokens_seen": step * config.batch_size * config.n_ctx,
                              "train_loss": train_loss, **row, "lr": lr_at(max(step - 1, 0), config),
                              "elapsed_s": time.perf_counter() - self.start})
        self.head_rows.extend({"step": step, **h} for h in heads)
        _save_quietly(lambda: self.model.save_pretrained(self.out_dir / "checkpoints" / f"step_{step:05d}"))
        _write_csv(pd.DataFrame(self.log_rows, columns=LOG_COLUMNS), self.out_dir / "training_log.csv")
        _write_csv(pd.DataFrame(self.head_rows, columns=HEAD_COLUMNS), self.out_dir / "training_heads.csv")


def load_training_log(folder):
    """(log_df, heads_df) from a training run folder (or the shipped model's folder), sorted by step."""
    import pandas as pd

    from headlens.errors import OutputPathError

    folder = Path(folder)
    paths = [folder / "training_log.csv", folder / "training_heads.csv"]
    for path in paths:
        if not path.is_file():
            raise OutputPathError(f"{path} not found: expected a folder written by `headlens train-tiny`")
    log = pd.read_csv(paths[0]).sort_values("step").reset_index(drop=True)
    heads = pd.read_csv(paths[1]).sort_values(["step", "layer", "head"]).reset_index(drop=True)
    return log, heads
