"""What an ablation is measured on: scored positions, the units the bootstrap resamples, the CI.

An `EvalSet` holds right-padded token sequences and which next-token predictions count
(`counted`: position t scores the prediction of token t + 1, the metric's target; prompts carry
their target as the last token). Sets of each kind:
- `text_evalset`: natural text cut into consecutive windows of at most the model's context
  (BOS prepended unless `bos=False`); every window is evaluated, a short text is one short
  window; at least 2 tokens of text are needed (one prediction);
- `repeat_evalset`: random tokens repeated twice, BOS first (Olsson et al. 2022); only the second
  copy counts, without its first token (TransformerLens `evals.induction_loss`: `loss[:, seq_len + 1:]`);
- prompts and needles: headlens.ablation.prompts.
Mean and resample ablation draw z from a reference set: by default the evaluation set itself
(every position), or a separate text (headlens.ablation.datasets).

Confidence intervals: a paired percentile bootstrap of the change (Efron & Tibshirani 1993). With
at least MIN_SEQUENCES sequences the bootstrap resamples whole sequences; with fewer (one long
window, a short text) it resamples blocks of consecutive scored tokens inside the sequences
(non-overlapping block bootstrap, Kunsch 1989), which keeps short-range dependence within a
block. `unit_label` says which.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from headlens.ablation.metrics import KIND
from headlens.capture import pad_batch
from headlens.errors import ConfigError, InputTextError
from headlens.probes import check_text, default_text, random_token_range, repeated_random_tokens, text_windows

N_BOOTSTRAP = 1000  # bootstrap resamples for every CI
MAX_TEXT_WINDOWS = 32  # windows evaluated at most; `description` states the cap when it applies
MIN_SEQUENCES = 10  # fewer sequences than this: the bootstrap resamples token blocks instead
MAX_BLOCK = 32  # tokens per bootstrap block (fewer when the text has under 20 blocks' worth)
REPEAT_N_SEQ = 16  # repeated-random-token sequences in the evaluation set
REPEAT_SEQ_LEN = 25  # tokens per copy (Olsson et al.: 25 random tokens)


@dataclass
class EvalSet:
    """Token sequences, the predictions that count, the bootstrap units and the reference set."""

    input_ids: torch.Tensor  # [n_seq, pos] right-padded token ids
    mask: torch.Tensor  # [n_seq, pos] bool, True on real tokens
    counted: torch.Tensor  # [n_seq, pos - 1] bool, True where the prediction of token t + 1 counts
    metric: str  # canonical metric name (headlens.ablation.metrics.METRICS)
    data_hash: str  # sha256 of what was measured
    description: str  # what the set is, in words (stated in the output)
    units: torch.Tensor | None = None  # [n_seq, pos - 1] long bootstrap unit of each counted position, -1 elsewhere
    unit_label: str = ""  # what the bootstrap resamples, in words
    foils: torch.Tensor | None = None  # [n_seq, pos - 1] long foil token where counted (logit-diff), else None
    reference_ids: torch.Tensor | None = None  # [n_ref, pos_ref] separate reference set; None: this set
    reference_mask: torch.Tensor | None = None  # [n_ref, pos_ref] bool
    reference_label: str = "the evaluation set"  # where mean / resampled z come from, in words

    def __post_init__(self):
        if self.units is None:
            self.units, self.unit_label = assign_units(self.counted, self.metric)

    @property
    def n_tokens(self) -> int:
        return int(self.counted.sum())

    @property
    def n_units(self) -> int:
        return int(self.units.max()) + 1 if self.n_tokens else 0

    @property
    def kind(self) -> str:
        return KIND[self.metric]

    def subset(self, rows: slice) -> EvalSet:
        """The sequences `rows` as their own set (bootstrap units recomputed, reference kept)."""
        return EvalSet(self.input_ids[rows], self.mask[rows], self.counted[rows], self.metric, self.data_hash,
                       self.description, foils=None if self.foils is None else self.foils[rows],
                       reference_ids=self.reference_ids, reference_mask=self.reference_mask,
                       reference_label=self.reference_label)

    def unit_counts(self) -> torch.Tensor:
        """Scored positions per bootstrap unit: [n_units]."""
        return torch.bincount(self.units[self.counted], minlength=self.n_units)


def assign_units(counted: torch.Tensor, metric: str) -> tuple[torch.Tensor, str]:
    """Bootstrap unit of every counted position: [n_seq, pos - 1] long (-1 where not counted),
    and what the units are. Sequences when there are MIN_SEQUENCES of them, else blocks of
    B = min(MAX_BLOCK, max(1, n_tokens // 20)) consecutive counted tokens of a sequence."""
    n_seq = counted.shape[0]
    units = torch.full(counted.shape, -1, dtype=torch.long)  # [n_seq, pos-1]
    noun = "prompts" if metric in ("logit-diff", "prob") or int(counted.sum(1).max()) <= 1 else "sequences"
    if n_seq >= MIN_SEQUENCES or noun == "prompts":
        rows = torch.arange(n_seq)[:, None].expand_as(counted)  # [n_seq, pos-1]
        units[counted] = rows[counted]
        return units, f"{n_seq} {noun}"
    block = min(MAX_BLOCK, max(1, int(counted.sum()) // 20))
    next_unit = 0
    for seq in range(n_seq):
        cols = torch.nonzero(counted[seq])[:, 0]  # [n_counted_seq]
        ids = torch.arange(len(cols)) // block + next_unit  # [n_counted_seq]
        units[seq, cols] = ids
        next_unit = int(ids.max()) + 1 if len(ids) else next_unit
    return units, f"{next_unit} blocks of up to {block} consecutive tokens ({n_seq} sequence{'s' * (n_seq > 1)})"


def pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_batch(seqs, pad_id)


def text_evalset(loaded, text, window: int | None = None, max_windows: int = MAX_TEXT_WINDOWS,
                 bos: bool = True, metric: str = "loss") -> EvalSet:
    """Consecutive windows of at most `window` tokens (default: the model's context) of `text`
    (default: the shipped held-out text), BOS first unless `bos=False`; every window is evaluated
    (at most `max_windows`, stated in `description`). InputTextError below 2 text tokens.

    `text` is a string, or documents (a headlens.corpus.Corpus, any iterable of strings): then
    windows never span two documents, and documents are read one at a time until `max_windows`."""
    window = window or loaded.spec.n_ctx
    bos_id = loaded.bos_token_id if bos else None
    min_tokens = 1 if bos else 2
    if text is None or isinstance(text, str):
        documents, label = [default_text() if text is None else check_text(text)], "text"
    else:
        documents, label = text, "documents"
    windows, available, n_text, n_docs, unread = [], 0, 0, 0, False
    digest = hashlib.sha256(f"text|{window}|{max_windows}|{bos}|".encode())
    stream = iter(documents)
    for document in stream:
        ids = loaded.tokenizer(document, add_special_tokens=False)["input_ids"]
        n_text, n_docs = n_text + len(ids), n_docs + 1
        digest.update((b"|doc|" if n_docs > 1 else b"") + document.encode("utf-8"))
        if len(ids) < min_tokens:
            continue
        found = text_windows(loaded.tokenizer, ids, window, bos_id, min_tokens=min_tokens)
        available += len(found)
        windows += found[: max(0, max_windows - len(windows))]
        if len(windows) >= max_windows:
            unread = next(stream, None) is not None  # more documents, neither read nor tokenized
            break
    if n_text < 2:
        raise InputTextError(f"text is {n_text} token{'s' * (n_text != 1)} long: an ablation needs at least 2 "
                             "(one next-token prediction)")
    if not windows:
        raise InputTextError(f"no document has {min_tokens} or more tokens: an ablation needs a window with one "
                             "next-token prediction")
    ids, mask = pad(windows, loaded.bos_token_id)
    counted = mask[:, 1:] & mask[:, :-1]  # [n_seq, pos-1]
    more = "the text has" if label == "text" else "the documents hold at least"
    capped = f" (capped: {more} {available + unread})" if available + unread > len(windows) else ""
    source = "text" if n_docs == 1 and label == "text" else f"{n_docs} documents"
    description = (f"{len(windows)} window{'s' * (len(windows) > 1)} of <= {window} tokens of {source}{capped}, "
                   f"{'BOS first' if bos else 'no BOS'}")
    return EvalSet(ids, mask, counted, metric, digest.hexdigest(), description)


def repeat_evalset(loaded, seed: int = 0, n_seq: int = REPEAT_N_SEQ, seq_len: int = REPEAT_SEQ_LEN) -> EvalSet:
    """Random tokens repeated twice, BOS first; the loss on the second copy counts."""
    if 1 + 2 * seq_len > loaded.spec.n_ctx:
        raise ConfigError(f"repeat probe of 2 x {seq_len} tokens exceeds the context of {loaded.spec.n_ctx}")
    low, high = random_token_range(loaded.spec.d_vocab)
    bos = loaded.bos_token_id
    ids = repeated_random_tokens(n_seq, seq_len, 2, low, high, bos, seed=seed)  # [n_seq, 1 + 2 * seq_len]
    mask = torch.ones_like(ids, dtype=torch.bool)  # [n_seq, pos]
    counted = torch.zeros((n_seq, ids.shape[1] - 1), dtype=torch.bool)  # [n_seq, pos-1]
    counted[:, seq_len + 1:] = True  # predictions of the second copy's tokens 2..seq_len
    digest = hashlib.sha256(f"repeat|{seed}|{n_seq}|{seq_len}|{low}|{high}|{bos}".encode()).hexdigest()
    description = f"{n_seq} sequences of {seq_len} random tokens in [{low}, {high}) repeated twice, BOS first"
    return EvalSet(ids, mask, counted, "repeat", digest, description)


def bootstrap_ci(base_sum: torch.Tensor, ablated_sum: torch.Tensor, counts: torch.Tensor,
                 seed: int, n_boot: int = N_BOOTSTRAP) -> list[float] | None:
    """Paired 95% percentile CI of the change of the mean, resampling bootstrap units.

    base_sum, ablated_sum, counts: [n_units] per-unit sums of the metric's values and scored
    positions; the same resampled units serve base and ablated (paired). None with < 2 units.
    """
    n = counts.shape[0]
    if n < 2:
        return None
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=gen)  # [n_boot, n_units]
    tokens = counts.double()[idx].sum(1)  # [n_boot]
    delta = (ablated_sum.double()[idx].sum(1) - base_sum.double()[idx].sum(1)) / tokens  # [n_boot]
    low, high = torch.quantile(delta, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [float(low), float(high)]


def head_seed(seed: int, layer: int, head: int) -> int:
    """A bootstrap seed per head that does not depend on sweep order (resume gives equal CIs)."""
    return (seed * 1_000_003 + layer * 1009 + head) % (2**63 - 1)
