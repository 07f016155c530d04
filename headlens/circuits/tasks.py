"""The tasks a circuit is found on: token sequences, where the metric reads the logits, and the metric.

A `Task` holds right-padded token sequences, the positions whose next-token logits the metric reads
(`where`), the token that should come next there (`target`) and, for a logit difference, the token it
is compared with (`foil`); `corrupted` is a second set of sequences of the same shape whose activations
stand in for the clean ones in resample ablation and path patching (None where none is meaningful).

- `induction_task`: random tokens repeated twice, BOS first (Olsson et al. 2022; the `repeat` metric of
  headlens.intervene.evalset): the metric is the mean loss (nats) on the second copy without its first
  token (TransformerLens `induction_loss`, `loss[:, seq_len + 1:]`); the corrupted run is another seeded
  draw of repeated random tokens, so a sender patched from it carries other tokens.
- `ioi_task`: indirect-object-identification prompts (Wang et al. 2022, arXiv 2211.00593) from
  headlens.scores.name_mover's templates and single-token names, or a user's `{"prompt", "target",
  "foil"}` prompts (headlens.intervene.evalset.read_prompts): the metric is logit(IO) - logit(S) at the
  prompt's last position (END), mean over prompts. The corrupted run of the template prompts is Wang et
  al.'s ABC distribution: each prompt with its three name slots (IO, S1, S2) filled by three distinct
  random names, so nothing in it says which name is the indirect object. User prompts have none.

The metric's linear part (`logit_metric`) is what direct effects add up to: the target's logit minus the
foil's, or minus the mean logit over the vocabulary when there is no foil (the loss's only term a
component writes linearly; the log-sum-exp is shared by all of them). For IOI both are the same number.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from headlens.circuits.readout import MetricTerms, read_offsets
from headlens.errors import ConfigError
from headlens.intervene.evalset import REPEAT_N_SEQ, REPEAT_SEQ_LEN, EvalSet, prompt_evalset
from headlens.intervene.metrics import position_values
from headlens.probes.inputs import random_token_range, repeated_random_tokens
from headlens.scores.name_mover import N_PROMPTS, TEMPLATES, ioi_prompts, name_tokens

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

IOI_PROMPTS = N_PROMPTS  # template prompts of the ioi task by default (name_mover's probe runs as many)
TASKS = ("induction", "ioi")
IOI_COUNTERFACTUALS = ("abc", "s2-io-flip")


@dataclass
class Task:
    """Sequences, the positions the metric reads, and the metric (see the module docstring)."""

    name: str  # "induction" or "ioi"
    tokens: torch.Tensor  # [batch, pos] long, right-padded
    mask: torch.Tensor  # [batch, pos] bool, True on real tokens
    where: torch.Tensor  # [batch, pos] bool, True where the metric reads the next-token logits
    target: torch.Tensor  # [batch, pos] long, the token that should come next where `where` (0 elsewhere)
    foil: torch.Tensor | None  # [batch, pos] long, the token compared with (0 elsewhere); None: no foil
    corrupted: torch.Tensor | None  # [batch, pos] long, the corrupted run (same mask); None: none
    metric_name: str  # "loss" or "logit-diff"
    unit: str  # "nats" or "logits"
    higher_is_better: bool
    description: str  # what the sequences are, in words
    prompts: list[dict] = field(default_factory=list)  # the IOI template prompts (name_mover's dicts), if any
    terms: object = None  # headlens.circuits.readout.MetricTerms where target/foil do not say the metric

    @property
    def n_read(self) -> int:
        """Positions the metric reads."""
        return int(self.where.sum())

    def read(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits where the metric reads them: [n_read, d_vocab], in `where.nonzero()` order. `logits` is
        [batch, pos, d_vocab], or already [n_read, d_vocab]."""
        return logits[self.where.to(logits.device)] if logits.dim() == 3 else logits

    def metric(self, logits: torch.Tensor) -> torch.Tensor:
        """The task's metric from the logits (0-d tensor, differentiable): mean loss or mean logit difference."""
        read = self.read(logits).float()  # [n_read, d_vocab]
        target = self.target[self.where].to(read.device)  # [n_read]
        rows = torch.arange(read.shape[0], device=read.device)
        if self.metric_name == "loss":
            return -torch.log_softmax(read, -1)[rows, target].mean()
        return self.logit_metric(logits)

    def logit_metric(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric's linear part (0-d tensor): mean of logit(target) - logit(foil), or of logit(target) -
        the mean logit when there is no foil. Direct effects add up to it."""
        read = self.read(logits).float()  # [n_read, d_vocab]
        rows = torch.arange(read.shape[0], device=read.device)
        own = read[rows, self.target[self.where].to(read.device)]  # [n_read]
        if self.foil is None:
            return (own - read.mean(-1)).mean()
        return (own - read[rows, self.foil[self.where].to(read.device)]).mean()

    def hidden_values(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        """The metric's value at each read position from the final norm's output there, hidden [..., n_read,
        d_model], by `ablate`'s own arithmetic (headlens.intervene.metrics.position_values): [..., n_read].
        Their mean is `metric`; the unembedding is applied in chunks (no [n_read, d_vocab] logits)."""
        target = self.target[self.where].to(hidden.device)  # [n_read]
        foil = None if self.foil is None else self.foil[self.where].to(hidden.device)  # [n_read]
        return position_values(hidden, lm_head, target, foil, "loss" if self.metric_name == "loss" else "logit_diff")

    def evalset(self, loaded: LoadedModel = None) -> EvalSet:
        """The task as an ablation evaluation set (headlens.intervene.evalset.EvalSet: the next-token layout
        `ablate` measures, read by replace.py and path patching): each read position's target written as
        the next token (one column appended), `counted` = `where`, the foils where there are; the corrupted
        run, when there is one, is the reference set mean and resample ablation draw z from. `loaded` is
        unused (the task holds its tokens)."""
        n, pos = self.tokens.shape
        ids = torch.cat([self.tokens, torch.zeros(n, 1, dtype=torch.long)], 1)  # [n, pos + 1]
        mask = torch.cat([self.mask, torch.zeros(n, 1, dtype=torch.bool)], 1)  # [n, pos + 1]
        rows, cols = self.where.nonzero(as_tuple=True)  # [n_read] each
        ids[rows, cols + 1], mask[rows, cols + 1] = self.target[rows, cols], True
        digest = hashlib.sha256(self.name.encode() + self.tokens.numpy().tobytes() + self.where.numpy().tobytes())
        evalset = EvalSet(
            ids,
            mask,
            self.where.clone(),
            "repeat" if self.metric_name == "loss" else "logit-diff",
            digest.hexdigest(),
            self.description,
            foils=None if self.foil is None else self.foil.clone(),
        )
        if self.corrupted is not None:
            evalset.reference_ids, evalset.reference_mask = self.corrupted, self.mask
            evalset.reference_label = "the task's corrupted run"
        return evalset

    def direction(self, w_u: torch.Tensor) -> torch.Tensor:
        """Per read position, the unembedding direction whose dot product with the final norm's output
        is that position's term of `logit_metric`: [n_read, d_model] from w_u [d_vocab, d_model]."""
        target = self.target[self.where].to(w_u.device)  # [n_read]
        if self.foil is None:
            return w_u[target].double() - w_u.double().mean(0)  # [n_read, d_model]
        return w_u[target].double() - w_u[self.foil[self.where].to(w_u.device)].double()  # [n_read, d_model]


def induction_task(
    loaded: LoadedModel,
    n: int = REPEAT_N_SEQ,
    seq_len: int = REPEAT_SEQ_LEN,
    seed: int = 0,
    corrupt_seed: int | None = None,
) -> Task:
    """`n` sequences of `seq_len` random tokens repeated twice, BOS first; the loss on the second copy
    (without its first token) is the metric. The corrupted run is the same draw with seed `corrupt_seed`
    (default seed + 1)."""
    if 1 + 2 * seq_len > loaded.spec.n_ctx:
        raise ConfigError(f"induction task of 2 x {seq_len} tokens exceeds the context of {loaded.spec.n_ctx}")
    if n < 1 or seq_len < 2:
        raise ConfigError(f"induction task needs n >= 1 and seq_len >= 2 (got n={n}, seq_len={seq_len})")
    low, high = random_token_range(loaded.spec.d_vocab)
    bos = loaded.bos_token_id
    tokens = repeated_random_tokens(n, seq_len, 2, low, high, bos, seed=seed)  # [n, 1 + 2 * seq_len]
    other = seed + 1 if corrupt_seed is None else corrupt_seed
    corrupted = repeated_random_tokens(n, seq_len, 2, low, high, bos, seed=other)  # [n, 1 + 2 * seq_len]
    offset = 0 if bos is None else 1  # the first copy starts here
    where = torch.zeros_like(tokens, dtype=torch.bool)  # [n, pos]
    # the second copy's first token onward, each predicting the copy's next token (2..seq_len)
    where[:, offset + seq_len : offset + 2 * seq_len - 1] = True
    target = torch.zeros_like(tokens)  # [n, pos]
    target[:, :-1] = tokens[:, 1:]
    target[~where] = 0
    description = (
        f"{n} sequences of {seq_len} random tokens in [{low}, {high}) repeated twice"
        f"{', BOS first' if bos is not None else ''}; loss on the second copy (seed {seed})"
    )
    return Task(
        "induction",
        tokens,
        torch.ones_like(tokens, dtype=torch.bool),
        where,
        target,
        None,
        corrupted,
        "loss",
        "nats",
        False,
        description,
    )


def ioi_task(
    loaded: LoadedModel,
    prompts: list[dict] | None = None,
    seed: int = 0,
    n: int = IOI_PROMPTS,
    templates=TEMPLATES,
    counterfactual: str = "abc",
) -> Task:
    """IOI prompts: `n` from the templates (seeded), or the user's `prompts` (dicts of
    headlens.intervene.evalset.read_prompts, each scored at its last position; no corrupted run). The
    template prompts' corrupted run: "abc" (Wang et al.'s ABC run, `abc_tokens`) or "s2-io-flip" (MIB's
    default IOI counterfactual: the subject's second mention replaced by the indirect object, so the
    answer flips)."""
    if counterfactual not in IOI_COUNTERFACTUALS:
        raise ConfigError(f"unknown IOI counterfactual {counterfactual!r}: choose {', '.join(IOI_COUNTERFACTUALS)}")
    if prompts is not None:
        return _prompts_task(loaded, prompts)
    built = ioi_prompts(loaded.tokenizer, loaded.bos_token_id, n, seed, templates)
    pad = loaded.bos_token_id if loaded.bos_token_id is not None else 0
    length = max(len(p["ids"]) for p in built)
    tokens = torch.full((len(built), length), pad, dtype=torch.long)  # [n, pos]
    mask = torch.zeros_like(tokens, dtype=torch.bool)  # [n, pos]
    where = torch.zeros_like(mask)  # [n, pos]
    target, foil = torch.zeros_like(tokens), torch.zeros_like(tokens)  # [n, pos]
    for row, p in enumerate(built):
        end = len(p["ids"]) - 1
        tokens[row, : end + 1], mask[row, : end + 1] = torch.tensor(p["ids"]), True
        where[row, end], target[row, end], foil[row, end] = True, p["io"], p["s"]
    if counterfactual == "abc":
        corrupted = abc_tokens(loaded, built, tokens, seed)
    else:
        corrupted = tokens.clone()  # [n, pos]
        for row, p in enumerate(built):
            corrupted[row, p["s2_pos"]] = tokens[row, p["io_pos"]]
    description = f"{len(built)} IOI prompts from {len(templates)} templates (seed {seed}), half ABBA, half BABA" + (
        "" if counterfactual == "abc" else "; counterfactual: S2 replaced by IO"
    )
    return Task("ioi", tokens, mask, where, target, foil, corrupted, "logit-diff", "logits", True, description, built)


def abc_tokens(loaded: LoadedModel, prompts: list[dict], tokens: torch.Tensor, seed: int) -> torch.Tensor:
    """Wang et al.'s ABC run: each prompt's IO, S1 and S2 slots filled by three distinct random single-token
    names (seeded): [n, pos], the positions of `tokens` kept."""
    names = sorted(set(name_tokens(loaded.tokenizer).values()))
    if len(names) < 3:
        raise ConfigError(f"the ABC run needs 3 single-token names; this tokenizer spells {len(names)}")
    gen = torch.Generator().manual_seed(seed + 1)
    corrupted = tokens.clone()  # [n, pos]
    for row, p in enumerate(prompts):
        a, b, c = (names[int(i)] for i in torch.randperm(len(names), generator=gen)[:3])
        corrupted[row, p["io_pos"]], corrupted[row, p["s1_pos"]], corrupted[row, p["s2_pos"]] = a, b, c
    return corrupted


def _prompts_task(loaded: LoadedModel, prompts: list[dict]) -> Task:
    """A user's prompts as an IOI task, tokenized as `ablate --prompts` does (BOS + prompt + target, the
    target a single token; headlens.intervene.evalset.prompt_evalset): the metric reads the last prompt token."""
    evalset = prompt_evalset(loaded, prompts, "logit-diff")
    tokens, mask = evalset.input_ids, evalset.mask  # [n, pos] each, the target appended
    where = torch.zeros_like(mask)  # [n, pos]
    where[:, :-1] = evalset.counted
    target, foil = torch.zeros_like(tokens), torch.zeros_like(tokens)  # [n, pos]
    target[:, :-1] = torch.where(evalset.counted, tokens[:, 1:], 0)
    foil[:, :-1] = torch.where(evalset.counted, evalset.foils, 0)
    description = f"{len(prompts)} prompt{'s' * (len(prompts) != 1)} from a file, scored at the last position"
    return Task("ioi", tokens, mask, where, target, foil, None, "logit-diff", "logits", True, description)


def make_task(loaded: LoadedModel, name: str, prompts: list[dict] | None = None, seed: int = 0) -> Task:
    """The task called `name` ("induction" or "ioi"; `prompts` only with ioi). ConfigError otherwise."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}")
    if name == "induction":
        if prompts is not None:
            raise ConfigError("the induction task reads no prompts: --prompts goes with --task ioi")
        return induction_task(loaded, seed=seed)
    return ioi_task(loaded, prompts=prompts, seed=seed)


def take_rows(task: Task, rows: torch.Tensor) -> Task:
    """The task on sequences `rows` (repeats allowed), its metric terms re-indexed."""
    terms = getattr(task, "terms", None)
    if terms is not None:
        offsets, parts = read_offsets(task.where), []
        for new_start, row in zip(read_offsets(task.where[rows])[:-1].tolist(), rows.tolist(), strict=True):
            mine = (terms.read >= offsets[row]) & (terms.read < offsets[row + 1])
            parts.append((terms.read[mine] - offsets[row] + new_start, terms.token[mine], terms.weight[mine]))
        terms = MetricTerms(terms.kind, *(torch.cat(p) for p in zip(*parts, strict=True)))
    pick = lambda t: None if t is None else t[rows]  # noqa: E731
    return replace(
        task,
        tokens=task.tokens[rows],
        mask=task.mask[rows],
        where=task.where[rows],
        target=task.target[rows],
        foil=pick(task.foil),
        corrupted=pick(task.corrupted),
        terms=terms,
    )
