"""The recipe of a tiny-model training run: one frozen dataclass, one preset per architecture."""

from __future__ import annotations

from dataclasses import dataclass

from headlens.errors import ConfigError

ARCHS = ("gpt2", "llama")  # GPT2LMHeadModel, LlamaForCausalLM


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of one stage of a tiny-model recipe. Defaults are the first stage of the shipped
    `tiny` (GPT-2); `stages(arch)` gives each shipped model's stages."""

    arch: str = "gpt2"  # "gpt2" (learned positions, LayerNorm, GELU) or "llama" (rotary, RMSNorm, SwiGLU, GQA)
    steps: int = 3000  # optimizer steps
    seed: int = 0  # seeds weights, data order, synthetic episodes and probes
    n_layers: int = 2  # transformer blocks (induction needs >= 2: Olsson et al.)
    n_heads: int = 4  # query heads per block
    n_kv_heads: int = 0  # key/value heads per block (llama only; 0 = n_heads, i.e. no grouping)
    d_model: int = 128  # residual width; d_head = d_model / n_heads
    d_mlp: int = 512  # MLP hidden width (GPT-2: 4 x d_model; llama: the SwiGLU intermediate size)
    n_ctx: int = 256  # context length, BOS included
    batch_size: int = 16  # sequences per step (16 x 256 tokens)
    lr: float = 1e-3  # peak learning rate (AdamW)
    warmup_steps: int = 50  # linear warmup from 0
    decay_share: float = 0.2  # the last share of steps decays lr linearly to lr * final_lr_share
    final_lr_share: float = 0.1  # lr at the last step, as a share of the peak
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # max global grad norm
    repeat_share: float = 0.75  # share of sequences that are repeated-random-segment episodes
    needle_share: float = 0.0  # share of sequences that are needle episodes (text, needle, text, needle again)
    printable_share: float = 0.5  # share of repeated segments drawn from printable ASCII (else any byte)
    segment_min: int = 8  # shortest repeated segment (tokens)
    segment_max: int = 64  # longest repeated segment (tokens)
    needle_min: int = 8  # shortest needle (tokens; the needle probe uses 16)
    needle_max: int = 24  # longest needle (tokens)
    checkpoint_every: int = 25  # steps between checkpoints (weights + log row)
    eval_windows: int = 16  # held-out windows of n_ctx tokens per evaluation
    probe_seqs: int = 16  # repeated-random-token probe sequences per evaluation
    probe_seq_len: int = 100  # length of each copy in [BOS, c, c]; 1 + 2 * len <= n_ctx
    probe_seed: int = 1234  # the probe set is fixed across checkpoints and seeds
    threads: int = 1  # torch CPU threads (determinism holds for a fixed count; 1 wastes least on a busy machine)
    train_attention: str = "eager"  # attention kernel of the training steps ("sdpa" halves the Llama step time)
    init_from: str = ""  # model folder whose weights start the run (the previous stage); "" = random init

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str):
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: must be {rule}")

        need(self.arch in ARCHS, "arch", f"one of {', '.join(ARCHS)}")
        need(self.train_attention in ("eager", "sdpa"), "train_attention", "eager or sdpa")
        for name in (
            "steps",
            "n_layers",
            "n_heads",
            "d_mlp",
            "batch_size",
            "checkpoint_every",
            "eval_windows",
            "probe_seqs",
            "threads",
        ):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.seed >= 0, "seed", ">= 0")
        need(self.d_model % self.n_heads == 0, "d_model", f"a multiple of n_heads ({self.n_heads})")
        need(
            self.n_kv_heads >= 0 and (self.n_kv_heads == 0 or self.n_heads % self.n_kv_heads == 0),
            "n_kv_heads",
            f"0 or a divisor of n_heads ({self.n_heads})",
        )
        need(
            self.arch == "llama" or self.n_kv_heads in (0, self.n_heads),
            "n_kv_heads",
            "0 for gpt2 (GPT-2 has no grouped-query attention)",
        )
        need(self.lr > 0, "lr", "> 0")
        need(self.warmup_steps >= 0, "warmup_steps", ">= 0")
        for name in ("decay_share", "final_lr_share", "repeat_share", "needle_share", "printable_share"):
            need(0 <= getattr(self, name) <= 1, name, "in [0, 1]")
        need(
            self.repeat_share + self.needle_share <= 1,
            "needle_share",
            f"<= 1 - repeat_share = {1 - self.repeat_share:g} (the rest is plain text)",
        )
        need(2 <= self.segment_min <= self.segment_max, "segment_min", f"in [2, segment_max={self.segment_max}]")
        need(self.segment_max <= (self.n_ctx - 1) // 2, "segment_max", f"<= (n_ctx - 1) // 2 = {(self.n_ctx - 1) // 2}")
        need(2 <= self.needle_min <= self.needle_max, "needle_min", f"in [2, needle_max={self.needle_max}]")
        need(self.needle_max <= (self.n_ctx - 1) // 4, "needle_max", f"<= (n_ctx - 1) // 4 = {(self.n_ctx - 1) // 4}")
        need(
            2 <= self.probe_seq_len <= (self.n_ctx - 1) // 2,
            "probe_seq_len",
            f"in [2, (n_ctx - 1) // 2 = {(self.n_ctx - 1) // 2}]",
        )

    @property
    def kv_heads(self) -> int:
        """Key/value heads per block (n_heads when not grouped)."""
        return self.n_kv_heads or self.n_heads


# The second stage of `tiny`: the first stage's model, trained on needle episodes and longer repeats
# (the first stage forms the previous-token and induction heads; this one teaches them to copy a
# needle out of text, the needle probe's task).
TINY_STAGE2 = {
    "steps": 600,
    "lr": 5e-4,
    "repeat_share": 0.35,
    "needle_share": 0.4,
    "segment_max": 96,
    "train_attention": "sdpa",
}
# The shipped `tiny-gqa` recipe: 8 query heads share 2 key/value heads per block (Ainslie et al. 2023),
# 3,000 steps at a constant learning rate of 2e-3, three quarters repeat episodes and 15% needle episodes
# (the runs that chose it are in headlens/data/tiny-gqa/README.md).
LLAMA_RECIPE = {
    "arch": "llama",
    "n_heads": 8,
    "n_kv_heads": 2,
    "d_mlp": 384,
    "steps": 3000,
    "decay_share": 0.0,
    "lr": 2e-3,
    "repeat_share": 0.75,
    "needle_share": 0.15,
    "train_attention": "sdpa",
}


def stages(arch: str = "gpt2", **overrides) -> tuple[TrainConfig, ...]:
    """The stages of a shipped recipe ("gpt2" -> tiny: two stages, "llama" -> tiny-gqa: one), each with
    `overrides`; a stage after the first starts from the previous stage's model (`init_from` is set
    by the training loop)."""
    if arch not in ARCHS:
        raise ConfigError(f"arch={arch!r} is invalid: must be one of {', '.join(ARCHS)}")
    if arch == "llama":
        return (TrainConfig(**{**LLAMA_RECIPE, **overrides}),)
    return TrainConfig(**overrides), TrainConfig(**{**TINY_STAGE2, **overrides})


def recipe(arch: str = "gpt2", **overrides) -> TrainConfig:
    """The last stage of a shipped recipe, with overrides (the configuration of the shipped weights)."""
    return stages(arch, **overrides)[-1]
