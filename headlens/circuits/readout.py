"""A task's metric as weighted terms on the next-token distribution, read from the logits' input.

Every circuit task's metric is a mean over its read positions of sum_t w_t g(logits)[token_t]:
- "logit": g = the logits (IOI's logit(IO) - logit(S): +1 on IO, -1 on S; a user task: +1/|answers| on
  each answer, -1/|wrong| on each wrong answer);
- "prob": g = softmax (Greater-than: +1 on each later year, -1 on each year up to the start year);
- "loss": g = -log softmax (induction: +1 on the next token, the mean loss in nats).
`MetricTerms` holds them as flat tensors (term -> read position, token, weight); `batch_sum` reads one
batch of rows from the residual entering the logits (final norm, then the unembedding, at the read
positions only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headlens.errors import ConfigError

KINDS = ("logit", "prob", "loss")


@dataclass
class MetricTerms:
    """Terms of a metric (module docstring): read index, token and weight per term, and the kind."""

    kind: str
    read: torch.Tensor  # [terms] long: index into the task's read positions (where.nonzero() order)
    token: torch.Tensor  # [terms] long
    weight: torch.Tensor  # [terms] float64


def task_terms(task) -> MetricTerms:
    """The task's own terms, or those its target and foil give (loss: the target's; logit-diff: +1
    target, -1 foil)."""
    own = getattr(task, "terms", None)
    if own is not None:
        return own
    where = task.where
    target = task.target[where]  # [n_read]
    index = torch.arange(target.shape[0])
    if task.metric_name == "loss":
        return MetricTerms("loss", index, target, torch.ones(len(index), dtype=torch.float64))
    if task.foil is None:
        raise ConfigError("a circuit's logit difference needs a foil for every prompt (give each prompt a 'foil')")
    foil = task.foil[where]  # [n_read]
    ones = torch.ones(len(index), dtype=torch.float64)
    return MetricTerms("logit", torch.cat([index, index]), torch.cat([target, foil]), torch.cat([ones, -ones]))


def read_offsets(where: torch.Tensor) -> torch.Tensor:
    """[batch + 1] long: where row r's read positions start in the task's read order."""
    return torch.cat([torch.zeros(1, dtype=torch.long), where.sum(1).cumsum(0)])


def batch_sum(adapter, terms: MetricTerms, where: torch.Tensor, rows: slice, final: torch.Tensor) -> torch.Tensor:
    """Sum over the read positions of rows `rows` of the metric's value (0-d, differentiable), from
    the residual entering the logits `final` [batch, pos, d_model]."""
    offsets = read_offsets(where)
    start, stop = int(offsets[rows.start]), int(offsets[rows.stop])
    hidden = adapter.final_norm()(final[where[rows].to(final.device)])  # [reads, d_model]
    logits = adapter.unembed()(hidden).float()  # [reads, d_vocab]
    if terms.kind == "prob":
        logits = torch.softmax(logits, -1)
    elif terms.kind == "loss":
        logits = -torch.log_softmax(logits, -1)
    mine = (terms.read >= start) & (terms.read < stop)  # [terms]
    picked = logits[terms.read[mine] - start, terms.token[mine]]  # [mine]
    return (picked.double() * terms.weight[mine].to(picked.device)).sum()


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ConfigError(f"unknown metric kind {kind!r}: choose one of {', '.join(KINDS)}")
    return kind
