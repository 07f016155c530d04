"""What an ablation is measured on: an evaluation set, a separate reference set, and the CI.

Two metrics (both mean next-token cross-entropy, in nats per counted token):
- `text`: windows of the model's context cut from natural text, BOS prepended explicitly
  (probes.text_windows); every next-token prediction inside a window counts.
- `repeat`: random tokens repeated twice with BOS prepended (Olsson et al. 2022); only the
  second copy counts, without its first token, which no induction head can predict
  (TransformerLens `evals.induction_loss`: `loss[:, seq_len + 1:]`).

The reference set (mean and resample ablation draw z from it) is kept separate from the
evaluation set (Wang et al. 2022): for `text`, windows alternate — even windows evaluate, odd
windows are the reference; for `repeat`, the reference is a second draw of random tokens with
another seed. The evaluation set is the same for every method, so `loss` is comparable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from headlens.capture import pad_batch
from headlens.errors import ConfigError, InputTextError
from headlens.probes import check_text, default_text, random_token_range, repeated_random_tokens, text_windows

METHODS = ("zero", "mean", "resample")
METRICS = ("text", "repeat")
N_BOOTSTRAP = 1000  # bootstrap resamples of the sequences for every CI
MAX_TEXT_WINDOWS = 32  # windows read from the text (16 evaluate, 16 reference); n_tokens reports the count
REPEAT_N_SEQ = 16  # repeated-random-token sequences in the evaluation set (and as many for reference)
REPEAT_SEQ_LEN = 25  # tokens per copy (Olsson et al.: 25 random tokens)


@dataclass
class EvalSet:
    """Token sequences with the next-token predictions that count, plus the reference set."""

    input_ids: torch.Tensor  # [n_seq, pos] right-padded token ids
    mask: torch.Tensor  # [n_seq, pos] bool, True on real tokens
    counted: torch.Tensor  # [n_seq, pos - 1] bool, True where the prediction of token t + 1 counts
    reference_ids: torch.Tensor | None  # [n_ref, pos_ref] the reference set (mean / resample)
    reference_mask: torch.Tensor | None  # [n_ref, pos_ref] bool
    metric: str
    data_hash: str  # sha256 of what was measured (text, or the repeat probe's settings)

    @property
    def n_tokens(self) -> int:
        return int(self.counted.sum())


def check_choice(method: str, metric: str) -> None:
    """ConfigError for an unknown method or metric."""
    if method not in METHODS:
        raise ConfigError(f"unknown ablation method {method!r}: choose one of {', '.join(METHODS)}")
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")


def _pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:

    return pad_batch(seqs, pad_id)


def text_evalset(loaded, text: str | None, window: int | None = None,
                 max_windows: int = MAX_TEXT_WINDOWS) -> EvalSet:
    """Windows of `window` tokens (default: the model's context) from `text` (default: the
    shipped held-out text); even windows evaluate, odd windows are the reference set.
    InputTextError when the text is shorter than one window."""

    text = default_text() if text is None else check_text(text)
    window = window or loaded.spec.n_ctx
    bos = loaded.bos_token_id
    windows = text_windows(loaded.tokenizer, text, window, bos, max_windows=max_windows)
    if len(windows[0]) < window:
        raise InputTextError(
            f"text is shorter than one window: {len(windows[0]) - 1} tokens, need {window - 1} "
            f"(window = the model's context of {window} tokens with BOS)")
    evaluate, reference = windows[0::2], windows[1::2]
    ids, mask = _pad(evaluate, bos)
    ref_ids, ref_mask = _pad(reference, bos) if reference else (None, None)
    counted = mask[:, 1:] & mask[:, :-1]  # [n_seq, pos-1]
    digest = hashlib.sha256(f"text|{window}|{max_windows}|".encode() + text.encode("utf-8")).hexdigest()
    return EvalSet(ids, mask, counted, ref_ids, ref_mask, "text", digest)


def repeat_id_range(d_vocab: int) -> tuple[int, int]:
    """Ids to draw random tokens from, valid for the vocabulary: probes.random_token_range, the
    classifier's band (printable ASCII for byte vocabularies; GPT-2: [1005, 10051), close to
    TransformerLens's 1000-10000), which skips the most common and the rarest tokens (Olsson)."""

    return random_token_range(d_vocab)


def repeat_evalset(loaded, seed: int = 0, n_seq: int = REPEAT_N_SEQ, seq_len: int = REPEAT_SEQ_LEN) -> EvalSet:
    """Random tokens repeated twice, BOS first; the loss on the second copy counts.
    The reference set is another draw (seed + 1), never the evaluation tokens."""

    if 1 + 2 * seq_len > loaded.spec.n_ctx:
        raise ConfigError(f"repeat probe of 2 x {seq_len} tokens exceeds the context of {loaded.spec.n_ctx}")
    low, high = repeat_id_range(loaded.spec.d_vocab)
    bos = loaded.bos_token_id
    ids = repeated_random_tokens(n_seq, seq_len, 2, low, high, bos, seed=seed)  # [n_seq, 1 + 2 * seq_len]
    ref = repeated_random_tokens(n_seq, seq_len, 2, low, high, bos, seed=seed + 1)  # [n_seq, 1 + 2 * seq_len]
    mask = torch.ones_like(ids, dtype=torch.bool)  # [n_seq, pos]
    counted = torch.zeros((n_seq, ids.shape[1] - 1), dtype=torch.bool)  # [n_seq, pos-1]
    counted[:, seq_len + 1:] = True  # predictions of the second copy's tokens 2..seq_len
    digest = hashlib.sha256(f"repeat|{seed}|{n_seq}|{seq_len}|{low}|{high}|{bos}".encode()).hexdigest()
    return EvalSet(ids, mask, counted, ref, torch.ones_like(ref, dtype=torch.bool), "repeat", digest)


def build_evalset(loaded, metric: str, text: str | None, seed: int) -> EvalSet:
    """The evaluation set of a metric (see the module docstring)."""
    if metric == "text":
        return text_evalset(loaded, text)
    return repeat_evalset(loaded, seed=seed)


def bootstrap_ci(base_sum: torch.Tensor, ablated_sum: torch.Tensor, counts: torch.Tensor,
                 seed: int, n_boot: int = N_BOOTSTRAP) -> tuple[float, float]:
    """Paired 95% percentile CI of the delta of token-weighted mean losses, resampling sequences.

    base_sum, ablated_sum, counts: [n_seq] per-sequence loss sums and counted tokens; the same
    resampled sequences serve base and ablated (paired bootstrap, Efron & Tibshirani 1993).
    """
    gen = torch.Generator().manual_seed(seed)
    n = counts.shape[0]
    idx = torch.randint(0, n, (n_boot, n), generator=gen)  # [n_boot, n_seq]
    tokens = counts.double()[idx].sum(1)  # [n_boot]
    delta = (ablated_sum.double()[idx].sum(1) - base_sum.double()[idx].sum(1)) / tokens  # [n_boot]
    low, high = torch.quantile(delta, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return float(low), float(high)


def head_seed(seed: int, layer: int, head: int) -> int:
    """A bootstrap seed per head that does not depend on sweep order (resume gives equal CIs)."""
    return (seed * 1_000_003 + layer * 1009 + head) % (2**63 - 1)
