"""What an ablation is measured on: the evaluation set of each metric, and its reference set.

An `EvalSet` holds right-padded token sequences and which next-token predictions count
(`counted`: position t scores the prediction of token t + 1, the metric's target; prompts carry
their target as the last token), and the bootstrap unit of each (headlens.intervene.stats). The set
of each metric (`build_evalset`):
- `loss` (alias `text`): natural text cut into consecutive windows of at most the model's context
  (BOS prepended unless `bos=False`); every window is evaluated, a short text is one short
  window; at least 2 tokens of text are needed (one prediction); or the targets of a prompts file;
- `repeat`: random tokens repeated twice, BOS first (Olsson et al. 2022); only the second
  copy counts, without its first token (TransformerLens `evals.induction_loss`: `loss[:, seq_len + 1:]`);
- `logit-diff` and `prob`: a prompts file (`--prompts FILE.jsonl`), one JSON object per line,
  `{"prompt": ..., "target": ..., "foil": ...}` (`foil` optional, needed by `logit-diff`), e.g. the
  indirect-object prompt "After John and Mary went to the store, Mary gave a bottle of milk to"
  with target " John" and foil " Mary" (Wang et al. 2022). Each prompt is scored at its last
  position; the target is appended as one more token, so the set reuses the next-token layout;
- `needle`: the needle-in-a-haystack tests of the retrieval probe (headlens.probes.inputs.needle_prompts,
  Wu et al. 2024 adapted to small contexts), scored teacher-forced: the sequence is the prompt
  followed by the rest of the needle, and each asked-for needle token counts 1 when it is the
  model's top prediction given the true earlier ones. Free greedy decoding (the retrieval probe's)
  would let one miss derail the rest; teacher forcing scores each token alone;
- `needle-loss`: the same tests and scored positions, each needle token's cross-entropy.
Reference set (mean and resample ablation draw z from it): by default the evaluation set itself,
every real position; or the windows of a separate reference text (`reference`), kept apart from the
evaluation as Wang et al. 2022 do for mean ablation.

Every pass over a set's sequences goes `batch_size` sequences at a time (`batches`); an ablation
given no size (None) takes `EvalSet.row_batches(None)`: consecutive slices that hold BATCH_SIZE
sequences, or as many more short ones as fill BATCH_TOKENS, cut where that runs the fewest tokens
(`packed_batches`): the report's 15 needle tests of 64, 128 and 256 tokens go 5, 5, 4 and 1 per pass
(2,240 tokens) instead of 4 at a time padded to each group's longest (2,560).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from headlens.bounds import shown
from headlens.capture import pad_batch
from headlens.errors import ConfigError, InputTextError
from headlens.files import parse_json, read_capped
from headlens.intervene.metrics import KIND, NEEDLE_METRICS, PROMPT_METRICS, canonical_metric
from headlens.intervene.stats import assign_units
from headlens.probes.inputs import (
    check_text,
    default_text,
    needle_prompts,
    needle_size,
    random_token_range,
    repeated_random_tokens,
    text_windows,
)
from headlens.probes.tokenize import encode, token_ids

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

BATCH_SIZE = 4  # evaluation sequences per forward (and backward) pass, every ablation computation
# Tokens an ablation's default batch may hold: BATCH_SIZE sequences of 256 tokens. Shorter sequences go more
# per pass (the 16 repeated-token sequences of 51 tokens go in one): on CPU a matrix product of a few hundred
# rows runs below the rate of one of several hundred more (BENCHMARKS.md, "less work per classify and per
# ablated run", has the figures).
BATCH_TOKENS = 1024
# What one more forward pass costs beyond its tokens, in tokens: its fixed per-pass work (hooks, launches,
# a matrix product of fewer rows running below the rate of a full one). packed_batches adds it per slice, so
# that a few padded tokens are not traded for an extra pass.
PASS_TOKENS = 128
MAX_TEXT_WINDOWS = 32  # windows evaluated at most; `description` states the cap when it applies
REPEAT_N_SEQ = 16  # repeated-random-token sequences in the evaluation set
REPEAT_SEQ_LEN = 25  # tokens per copy (Olsson et al.: 25 random tokens)
# Longest evaluation sequence (text window, needle test): GPT-2 small's whole context. Longer contexts
# (SmolLM2 8,192, Gemma 3 32,768) cost time superlinearly in every ablation while the roles tested here act
# within a few hundred tokens; pass `window` to text_evalset for longer windows.
EVAL_CONTEXT = 1024


def eval_context(loaded: LoadedModel) -> int:
    """Tokens an evaluation sequence may hold on this model: min(n_ctx, EVAL_CONTEXT)."""
    return min(loaded.spec.n_ctx, EVAL_CONTEXT)


def batches(n_seq: int, batch_size: int = BATCH_SIZE) -> list[slice]:
    """The consecutive slices of `batch_size` sequences (the last one shorter) covering `n_seq`."""
    return [slice(start, min(start + batch_size, n_seq)) for start in range(0, n_seq, batch_size)]


def packed_batches(
    lengths: Sequence[int], budget: int = BATCH_TOKENS, least: int = BATCH_SIZE, pass_tokens: int = PASS_TOKENS
) -> list[slice]:
    """Consecutive slices covering sequences of these lengths, each holding at most `least` sequences or at
    most `budget` tokens at its longest sequence's length, that cost the least: a slice costs its size
    times its longest length (the padded tokens it runs) plus `pass_tokens`; among equal costs the first
    slices are the largest. Sequences of one length go max(least, budget // length) per slice."""
    n = len(lengths)
    best: list = [(0, 0)] * (n + 1)  # [i]: (cost, -first slice size) of sequences i.. on
    stop = [n] * (n + 1)  # [i]: where the first slice of that best cut ends
    for start in range(n - 1, -1, -1):
        width, choice = 0, None
        for end in range(start + 1, n + 1):
            width = max(width, int(lengths[end - 1]))
            size = end - start
            if size > max(least, 1) and size * width > budget:
                break  # longer slices only grow; one sequence alone is always allowed
            cost = (best[end][0] + size * width + pass_tokens, -size)
            if choice is None or cost < choice:
                choice, stop[start] = cost, end
        best[start] = choice
    cuts, start = [], 0
    while start < n:
        cuts.append(slice(start, stop[start]))
        start = stop[start]
    return cuts


def row_batches(mask: torch.Tensor, batch_size: int | None) -> list[slice]:
    """The slices of a right-padded set's sequences (mask [n_seq, pos]) each pass takes: `batch_size` at a
    time, or with None packed by their lengths (packed_batches)."""
    if batch_size is not None:
        return batches(mask.shape[0], batch_size)
    reach = mask.shape[1] - torch.flip(mask, dims=[1]).int().argmax(1)  # [n_seq] last real position + 1
    return packed_batches(reach.tolist())


def cut_padding(input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch [batch, pos] cut after the last position any of its sequences reaches: [batch, width].
    Exact: the sequences are right-padded and attention is causal, so no real position reads the cut
    columns. Needle tests of 64 to 256 tokens in one set cost their own lengths, not 256 each."""
    width = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else mask.shape[1]
    return input_ids[:, :width], mask[:, :width]


@dataclass
class EvalSet:
    """Token sequences, the predictions that count, the bootstrap units and the reference set."""

    input_ids: torch.Tensor  # [n_seq, pos] right-padded token ids
    mask: torch.Tensor  # [n_seq, pos] bool, True on real tokens
    counted: torch.Tensor  # [n_seq, pos - 1] bool, True where the prediction of token t + 1 counts
    metric: str  # canonical metric name (headlens.intervene.metrics.METRICS)
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
        return EvalSet(
            self.input_ids[rows],
            self.mask[rows],
            self.counted[rows],
            self.metric,
            self.data_hash,
            self.description,
            foils=None if self.foils is None else self.foils[rows],
            reference_ids=self.reference_ids,
            reference_mask=self.reference_mask,
            reference_label=self.reference_label,
        )

    def batch(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids and mask of the sequences `rows`, without the padding none of them reaches
        (cut_padding): [batch, width] each. Scored positions index them as they do the whole set."""
        return cut_padding(self.input_ids[rows], self.mask[rows])

    def row_batches(self, batch_size: int | None = None) -> list[slice]:
        """The slices of sequences each forward pass takes: `batch_size` at a time, or with None as many
        as BATCH_TOKENS holds (at least BATCH_SIZE), cut where the passes run the fewest tokens (packed_batches)."""
        return row_batches(self.mask, batch_size)

    def unit_counts(self) -> torch.Tensor:
        """Scored positions per bootstrap unit: [n_units]."""
        return torch.bincount(self.units[self.counted], minlength=self.n_units)


def pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_batch(seqs, pad_id)


def text_evalset(
    loaded: LoadedModel,
    text,
    window: int | None = None,
    max_windows: int = MAX_TEXT_WINDOWS,
    bos: bool = True,
    metric: str = "loss",
) -> EvalSet:
    """Consecutive windows of at most `window` tokens (default: eval_context) of `text`
    (default: the shipped held-out text), BOS first unless `bos=False`; every window is evaluated
    (at most `max_windows`, stated in `description`). InputTextError below 2 text tokens.

    `text` is a string, or documents (a headlens.probes.corpus.Corpus, any iterable of strings): then
    windows never span two documents, and documents are read one at a time until `max_windows`."""
    window = window or eval_context(loaded)
    bos_id = loaded.bos_token_id if bos else None
    min_tokens = 1 if bos else 2
    if text is None or isinstance(text, str):
        documents, label = [default_text() if text is None else check_text(text)], "text"
    else:
        documents, label = text, "documents"
    windows, available, n_text, n_docs, unread = [], 0, 0, 0, False
    digest = hashlib.sha256(f"text|{window}|{max_windows}|{bos}|".encode())
    stream = iter(documents)
    body = window - (1 if bos_id is not None else 0)
    for document in stream:
        ids, cut = token_ids(loaded.tokenizer, document, max(1, (max_windows - len(windows)) * body))
        unread = unread or cut  # a long document: tokenized only as far as the windows still need
        n_text, n_docs = n_text + len(ids), n_docs + 1
        digest.update((b"|doc|" if n_docs > 1 else b"") + document.encode("utf-8"))
        if len(ids) < min_tokens:
            continue
        found = text_windows(loaded.tokenizer, ids, window, bos_id, min_tokens=min_tokens)
        available += len(found)
        windows += found[: max(0, max_windows - len(windows))]
        if len(windows) >= max_windows:
            unread = unread or next(stream, None) is not None  # more documents, neither read nor tokenized
            break
    if n_text < 2:
        raise InputTextError(
            f"text is {n_text} token{'s' * (n_text != 1)} long: an ablation needs at least 2 "
            "(one next-token prediction)"
        )
    if not windows:
        raise InputTextError(
            f"no document has {min_tokens} or more tokens: an ablation needs a window with one next-token prediction"
        )
    ids, mask = pad(windows, loaded.bos_token_id)
    counted = mask[:, 1:] & mask[:, :-1]  # [n_seq, pos-1]
    more = "the text has" if label == "text" else "the documents hold at least"
    capped = f" (capped: {more} {available + unread})" if available + unread > len(windows) else ""
    source = "text" if n_docs == 1 and label == "text" else f"{n_docs} documents"
    description = (
        f"{len(windows)} window{'s' * (len(windows) > 1)} of <= {window} tokens of {source}{capped}, "
        f"{'BOS first' if bos else 'no BOS'}"
    )
    return EvalSet(ids, mask, counted, metric, digest.hexdigest(), description)


def repeat_evalset(
    loaded: LoadedModel, seed: int = 0, n_seq: int = REPEAT_N_SEQ, seq_len: int = REPEAT_SEQ_LEN
) -> EvalSet:
    """Random tokens repeated twice, BOS first; the loss on the second copy counts."""
    if 1 + 2 * seq_len > loaded.spec.n_ctx:
        raise ConfigError(f"repeat probe of 2 x {seq_len} tokens exceeds the context of {loaded.spec.n_ctx}")
    low, high = random_token_range(loaded.spec.d_vocab)
    bos = loaded.bos_token_id
    ids = repeated_random_tokens(n_seq, seq_len, 2, low, high, bos, seed=seed)  # [n_seq, 1 + 2 * seq_len]
    mask = torch.ones_like(ids, dtype=torch.bool)  # [n_seq, pos]
    counted = torch.zeros((n_seq, ids.shape[1] - 1), dtype=torch.bool)  # [n_seq, pos-1]
    counted[:, seq_len + 1 :] = True  # predictions of the second copy's tokens 2..seq_len
    digest = hashlib.sha256(f"repeat|{seed}|{n_seq}|{seq_len}|{low}|{high}|{bos}".encode()).hexdigest()
    description = f"{n_seq} sequences of {seq_len} random tokens in [{low}, {high}) repeated twice, BOS first"
    return EvalSet(ids, mask, counted, "repeat", digest, description)


MAX_PROMPTS = 100_000  # prompts a --prompts file may hold


def json_objects(path, flag: str, example: str):
    """(where, object) for each non-blank line of a JSONL file, `where` naming the file and line.
    InputTextError for bad JSON (headlens.files.parse_json), a line that is not an object (`example`
    shows one), past MAX_PROMPTS objects; a file that is not a regular file or larger than
    headlens.files.MAX_JSON_BYTES is refused before it is read (`flag`, the option, names it)."""
    path = Path(path)
    text = check_text(read_capped(path, flag, InputTextError), str(path))
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{shown(str(path))} line {number}"
        if count == MAX_PROMPTS:
            raise InputTextError(f"{where}: more than {MAX_PROMPTS:,} prompts; give fewer")
        obj = parse_json(line, where, InputTextError)
        if not isinstance(obj, dict):
            raise InputTextError(f"{where}: expected an object like {example}")
        count += 1
        yield where, obj


def read_prompts(path) -> list[dict]:
    """The prompts of a JSONL file: dicts with `prompt`, `target`, `foil` (or None) and `line`.

    InputTextError naming the line for bad JSON, a non-object, a missing or non-string field, past
    MAX_PROMPTS prompts; blank lines are skipped (json_objects)."""
    prompts = []
    for where, obj in json_objects(path, "--prompts", '{"prompt": ..., "target": ...}'):
        for key in ("prompt", "target"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise InputTextError(f"{where}: missing or empty string field {key!r}")
        foil = obj.get("foil")
        if foil is not None and (not isinstance(foil, str) or not foil):
            raise InputTextError(f"{where}: field 'foil' must be a non-empty string")
        prompts.append({"prompt": obj["prompt"], "target": obj["target"], "foil": foil, "line": where})
    if not prompts:
        raise InputTextError(f"{path} holds no prompts")
    return prompts


def _one_token(tokenizer, text: str, field: str, where: str) -> int:
    ids = encode(tokenizer, text)
    if len(ids) != 1:
        raise InputTextError(
            f"{where}: {field} {text!r} is {len(ids)} tokens; give a single token "
            '(often a word with its leading space, e.g. " John")'
        )
    return int(ids[0])


def prompt_evalset(loaded: LoadedModel, prompts: list[dict], metric: str) -> EvalSet:
    """One sequence per prompt, BOS + prompt + target, scoring the prediction of the target."""
    tok, bos, n_ctx = loaded.tokenizer, loaded.bos_token_id, loaded.spec.n_ctx
    seqs, targets, foils = [], [], []
    for item in prompts:
        ids = encode(tok, item["prompt"])
        target = _one_token(tok, item["target"], "target", item["line"])
        foil = _one_token(tok, item["foil"], "foil", item["line"]) if item["foil"] is not None else -1
        if metric == "logit-diff" and foil < 0:
            raise InputTextError(f"{item['line']}: metric logit-diff needs a 'foil' on every line")
        if 2 + len(ids) > n_ctx:
            raise InputTextError(
                f"{item['line']}: prompt is {len(ids)} tokens; this model's context of {n_ctx} "
                f"holds at most {n_ctx - 2} (with BOS and the target)"
            )
        seqs.append([bos, *ids, target])
        targets.append(target)
        foils.append(foil)
    ids, mask = pad(seqs, bos)
    last = mask.sum(1) - 2  # [n_seq] the position that predicts the target
    counted = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)  # [n_seq, pos-1]
    counted[torch.arange(len(seqs)), last] = True
    foil_ids = torch.zeros_like(counted, dtype=torch.long)  # [n_seq, pos-1]
    foil_ids[torch.arange(len(seqs)), last] = torch.tensor(foils).clamp(min=0)
    digest = hashlib.sha256(json.dumps([[p["prompt"], p["target"], p["foil"]] for p in prompts]).encode()).hexdigest()
    description = f"{len(seqs)} prompt{'s' * (len(seqs) > 1)}, BOS first, scored at the last position"
    return EvalSet(ids, mask, counted, metric, digest, description, foils=foil_ids if min(foils) >= 0 else None)


def needle_evalset(
    loaded: LoadedModel,
    text: str | None,
    seed: int = 0,
    needle_len: int = 16,
    restate: int = 4,
    metric: str = "needle",
    context: int | None = None,
) -> EvalSet:
    """Needle-in-a-haystack tests in `text` (default: the shipped held-out text) of at most `context`
    tokens (default: eval_context), teacher-forced: each asked-for needle token (after the `restate`
    restated ones) is one scored position, of `metric` `needle` (top-1 hit) or `needle-loss` (cross-entropy)."""
    text = default_text() if text is None else check_text(text)
    spec = loaded.spec
    context = min(context or eval_context(loaded), eval_context(loaded))
    needle_len, restate = needle_size(context, needle_len, restate)
    hay = token_ids(loaded.tokenizer, text, context)[0]  # a long text: its first piece(s), past any test's length
    tests = needle_prompts(
        hay,
        context,
        loaded.bos_token_id,
        random_token_range(spec.d_vocab),
        needle_len=needle_len,
        restate=restate,
        seed=seed,
    )
    seqs = [test.prompt + test.needle[test.restate :] for test in tests]
    ids, mask = pad(seqs, loaded.bos_token_id)
    counted = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)  # [n_seq, pos-1]
    for row, test in enumerate(tests):
        first = len(test.prompt) - 1  # the prompt's last token predicts the first asked-for needle token
        counted[row, first : first + len(test.needle) - test.restate] = True
    if int(counted.sum()) == 0:
        raise ConfigError(f"{metric} metric: no needle token to score")
    digest = hashlib.sha256(f"needle|{seed}|{needle_len}|{restate}|".encode() + text.encode("utf-8")).hexdigest()
    description = (
        f"{len(tests)} needle-in-a-haystack tests of <= {context} tokens ({needle_len}-token needles, "
        f"{restate} restated), teacher-forced"
    )
    return EvalSet(ids, mask, counted, metric, digest, description)


def build_evalset(
    loaded: LoadedModel,
    metric: str,
    text: str | None = None,
    seed: int = 0,
    prompts: list[dict] | None = None,
    reference: str | None = None,
    bos: bool = True,
    context: int | None = None,
    window: int | None = None,
) -> EvalSet:
    """The evaluation set of `metric` (see the module docstring); `prompts` from `read_prompts`;
    `reference` a text for mean / resample ablation; `context` caps the needle tests' length and
    `window` the text windows' (default: eval_context each)."""
    metric = canonical_metric(metric)
    if text is not None and not isinstance(text, str) and metric in NEEDLE_METRICS:
        raise ConfigError(
            f"metric {metric} reads one text: give --text a text file (a folder or JSON Lines "
            "file of documents goes with the loss metric)"
        )
    if prompts is not None:
        if metric not in PROMPT_METRICS:
            raise ConfigError(
                f"metric {metric} does not score prompts: with --prompts choose one of {', '.join(PROMPT_METRICS)}"
            )
        evalset = prompt_evalset(loaded, prompts, metric)
    elif metric in ("logit-diff", "prob"):
        raise ConfigError(
            f"metric {metric} scores prompts: give --prompts FILE.jsonl "
            '(lines of {"prompt": ..., "target": ..., "foil": ...})'
        )
    elif metric == "loss":
        evalset = text_evalset(loaded, text, window=window, bos=bos)
    elif metric == "repeat":
        evalset = repeat_evalset(loaded, seed=seed)
    else:
        evalset = needle_evalset(loaded, text, seed=seed, metric=metric, context=context)
    if reference is not None:
        with_reference(loaded, evalset, reference)
    return evalset


def with_reference(loaded: LoadedModel, evalset: EvalSet, text: str, label: str = "the reference text") -> EvalSet:
    """Attach the windows of `text` (BOS first, at most MAX_TEXT_WINDOWS) as the reference set."""
    text = check_text(text, label)
    bos = loaded.bos_token_id
    windows = text_windows(loaded.tokenizer, text, eval_context(loaded), bos, max_windows=MAX_TEXT_WINDOWS)
    evalset.reference_ids, evalset.reference_mask = pad(windows, bos)
    n_pos = int(evalset.reference_mask.sum())
    evalset.reference_label = f"{label} ({len(windows)} windows, {n_pos} positions)"
    evalset.data_hash = hashlib.sha256(evalset.data_hash.encode() + b"|ref|" + text.encode("utf-8")).hexdigest()
    return evalset
