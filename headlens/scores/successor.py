"""Successor heads: the OV circuit maps a token of an ordinal sequence onto its successor.

Gould et al. 2023, "Successor Heads: Recurring, Interpretable Attention Heads In The Wild"
(arXiv 2312.09230, ICLR 2024). On ordinal tasks (numbers 1-200, number words, ordinals, days,
months, letters), apply the head's OV circuit to the effective embedding W_EE(t) (headlens.scores.
ov_circuit), unembed, and keep only the logits of the task's own tokens; the head succeeds on t
when the top-1 of those is t's successor (Monday -> Tuesday). The succession score is the share
of (t, successor) pairs, over all tasks, on which it succeeds; weights only, no text.

Probe for any tokenizer: each task's words are tried with a leading space (" Monday", GPT-2 and
Llama vocabularies) and without ("Monday"); the form with more single-token words is kept, and a
pair counts only when both words are single tokens (SmolLM2 splits numbers into digits, so its
numbers task is 1-9). A task with fewer than MIN_TASK_TOKENS single tokens is dropped.

Cut-off: Gould et al. rank heads by the score and fix no threshold. We call a head a successor head
at SUCCESSOR_MIN = 0.5: it names the successor on more than half of the pairs, where a head
without the mechanism names it at about the chance of 1 / (task size) (1/26 to 1/10 here).
"""

from __future__ import annotations

import calendar
import string
from dataclasses import dataclass

import torch

from headlens.errors import ConfigError
from headlens.probes.tokenize import encode
from headlens.scores.ov_circuit import ov_logits

SUCCESSOR_MIN = 0.5  # share of pairs (ours; Gould et al. rank heads without a cut-off)
MIN_TASK_TOKENS = 3  # a task needs at least this many single-token words to hold one pair and a foil

NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth".split()
TASKS = {
    "numbers": tuple(str(n) for n in range(1, 201)),
    "number_words": tuple(NUMBER_WORDS),
    "number_words_capital": tuple(w.capitalize() for w in NUMBER_WORDS),
    "ordinals": tuple(ORDINALS),
    "days": tuple(calendar.day_name),  # Monday..Sunday (English: calendar's default C locale)
    "months": tuple(calendar.month_name[1:]),
    "letters": tuple(string.ascii_uppercase),
    "letters_lower": tuple(string.ascii_lowercase),
}


@dataclass(frozen=True)
class SuccessorTask:
    """One ordinal task as token ids: the candidates and the (token, successor) pairs."""

    name: str  # key of TASKS
    tokens: torch.Tensor  # [c] ids of the task's single-token words, in order
    pairs: torch.Tensor  # [p, 2] (source index, successor index) into `tokens`


def successor_tasks(tokenizer) -> list[SuccessorTask]:
    """The tasks of TASKS that `tokenizer` spells with single tokens (see the module docstring)."""
    tasks = []
    for name, words in TASKS.items():
        best: list[int | None] = []
        for prefix in (" ", ""):
            ids = [_single(tokenizer, prefix + w) for w in words]
            if sum(i is not None for i in ids) > sum(i is not None for i in best):
                best = ids
        kept = [i for i in best if i is not None]
        if len(kept) < MIN_TASK_TOKENS or len(set(kept)) < len(kept):
            continue
        index = {tok: n for n, tok in enumerate(kept)}
        pairs = [(index[a], index[b]) for a, b in zip(best, best[1:], strict=False) if a is not None and b is not None]
        if pairs:
            tasks.append(SuccessorTask(name, torch.tensor(kept), torch.tensor(pairs)))
    return tasks


def _single(tokenizer, text: str) -> int | None:
    ids = encode(tokenizer, text)
    return int(ids[0]) if len(ids) == 1 else None


def succession_hits(logits: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Per pair, 1.0 where the successor's logit beats every other task token's (strictly):
    logits [..., c, c] (source token x candidate), pairs [p, 2] -> [..., p]."""
    rows = logits[..., pairs[:, 0], :]  # [..., p, c]
    target = rows.gather(-1, pairs[:, 1].expand(*rows.shape[:-1])[..., None])  # [..., p, 1]
    others = rows.scatter(-1, pairs[:, 1].expand(*rows.shape[:-1])[..., None], float("-inf"))  # [..., p, c]
    return (target[..., 0] > others.max(-1).values).double()  # [..., p]


def successor_scores(model, tasks: list[SuccessorTask]) -> torch.Tensor:
    """Succession score of every head: [n_layers, n_heads] (float64), the share of all tasks'
    pairs on which the head's OV circuit ranks the successor first among the task's tokens."""
    if not tasks:
        raise ConfigError("no successor task is spelt with single tokens by this tokenizer")
    tokens = torch.cat([task.tokens for task in tasks])  # [n]: every task's tokens, task after task
    logits = ov_logits(model, tokens, tokens)  # [layer, head, n, n]: one pass over the layers
    hits, start = [], 0
    for task in tasks:
        part = slice(start, start + len(task.tokens))
        hits.append(succession_hits(logits[..., part, part], task.pairs))  # [layer, head, p]
        start = part.stop
    return torch.cat(hits, dim=-1).mean(-1)  # [layer, head]


def successor_heads(scores: torch.Tensor, threshold: float = SUCCESSOR_MIN) -> list[tuple[int, int]]:
    """(layer, head) of the heads scoring at least `threshold`, sorted."""
    return [(int(l_), int(h)) for l_, h in (scores >= threshold).nonzero().tolist()]
