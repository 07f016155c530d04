"""The evaluation set of an ablation as one value (`EvalSpec`), its token budget, and each role's own metric.

An `EvalSpec` names what an ablation is measured on: the metric, its data (a text or documents, a
prompts list, the needle tests' text), the reference text of mean / resample ablation, BOS, the
needle tests' length and the token budget. `ablate_heads`, `sweep_heads`, `prune_curve` and the
command line take one, as scikit-learn groups an estimator's parameters; `EvalSpec.build` makes
the EvalSet (headlens.intervene.evalset).

Token budget (`tokens`): an ablation reads at most that many tokens of its set (None: all of it).
Whole sequences are kept, evenly spaced over the set (text windows from the whole text, needle
tests of every length), as many as fit; one sequence at least, and a text's windows are no longer
than the budget. The bootstrap runs over the sequences kept (EvalSet recomputes its units).

Each role has its own metric (`ROLE_METRICS`): induction heads are ablated on repeated random
tokens (Olsson et al. 2022), retrieval heads on the needle tests' loss (Wu et al. 2024), name
movers on the logit difference over the IOI prompts (Wang et al. 2022). `choose_metric` says
which metric a run uses and why, and notes an explicit metric that is not the role's own.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from headlens.bounds import parse_count, shown
from headlens.errors import ConfigError
from headlens.intervene.evalset import EvalSet, build_evalset, eval_context
from headlens.intervene.metrics import canonical_metric, check_choice

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

# Tokens an ablation reads by default (`--tokens`): a fraction of a long text, whose 95% CI is wider than the
# whole text's but still tells an effect from none (BENCHMARKS.md, "token budget", has the widths and costs).
DEFAULT_TOKENS = 4096
# Tokens the single-head sweep reads by default: it runs every head (270 on SmolLM2) from its layer on, so
# its cost is about half as many ablated runs as heads (headlens.ablation.estimate states the FLOPs and time
# before a run; BENCHMARKS.md, "token budget", has the figures).
SWEEP_TOKENS = 512
ALL = "all"  # `--tokens all`: every token of the set

# role -> (its metric, why, in words)
ROLE_METRICS = {
    "induction": ("repeat", "induction heads copy the second half of repeated random tokens (Olsson et al. 2022)"),
    "retrieval": ("needle-loss", "retrieval heads copy needles out of a haystack (Wu et al. 2024)"),
    "name_mover": ("logit-diff", "name movers copy the indirect object's name at IOI prompts' end (Wang et al. 2022)"),
}
IOI = "ioi"  # `prompts` naming the built-in IOI prompts (headlens.scores.name_mover.ioi_prompts)
IOI_PROMPTS = 48


def parse_tokens(value: Any) -> int | None:
    """A token budget from `--tokens`: a positive integer, or `all` (None). ConfigError otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() == ALL):
        return None
    tokens = parse_count(value) if isinstance(value, str) else _integer(value)  # typed: ASCII digits only
    if tokens is None:
        raise ConfigError(f"--tokens {shown(value)} is not understood: give a number of tokens (e.g. 4096) or all")
    if tokens < 2:
        raise ConfigError(f"--tokens {tokens} is too small: an ablation needs at least 2 tokens")
    return tokens


def _integer(value: Any) -> int | None:
    """`value` as an int when it is an integer (numpy's included, a bool not), else None."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


def budget_label(tokens: int | None) -> str:
    return "all tokens" if tokens is None else f"{tokens:,} tokens"


def choose_metric(role: str | None, metric: str | None) -> tuple[str, str | None]:
    """The metric a run uses and a line saying why (None: nothing to say). No metric given: the
    role's own, or `loss`. A metric given that is not the role's own is kept, with a note."""
    own = ROLE_METRICS.get(role or "")
    if metric is None:
        if own is None:
            return "loss", None
        return own[0], f"metric {own[0]}: the {role} role's own metric; {own[1]}"
    metric = canonical_metric(metric)
    if own is not None and metric != own[0]:
        return metric, f"note: metric {metric} as asked; the {role} role's own metric is {own[0]} ({own[1]})"
    return metric, None


@dataclass(frozen=True)
class EvalSpec:
    """What an ablation is measured on (see the module docstring)."""

    metric: str = "loss"  # headlens.intervene.metrics.METRICS (or an alias)
    text: Any = None  # a text, documents (headlens.probes.corpus.Corpus) or None: the shipped held-out text
    prompts: Any = None  # dicts from evalset.read_prompts, IOI (the built-in IOI prompts) or None
    reference: str | None = None  # the text mean / resample ablation draw z from; None: the set itself
    bos: bool = True  # BOS before each text window
    context: int | None = None  # longest needle test; None: evalset.eval_context
    tokens: int | None = DEFAULT_TOKENS  # the token budget; None: every token

    def build(self, loaded: LoadedModel, seed: int = 0) -> EvalSet:
        """The EvalSet: the metric's set (evalset.build_evalset), cut to the token budget."""
        prompts = ioi_prompts(loaded, seed) if self.prompts == IOI else self.prompts
        window = None if self.tokens is None else min(self.tokens, eval_context(loaded))
        evalset = build_evalset(
            loaded, self.metric, self.text, seed, prompts, self.reference, self.bos, self.context, window=window
        )
        return within_budget(evalset, self.tokens)

    @classmethod
    def for_role(cls, role: str | None, metric: str | None = None, **fields: Any) -> tuple[EvalSpec, str | None]:
        """The EvalSpec of an ablation of `role`'s heads (None: explicit heads) from keyword fields, and a line
        on the metric chosen (choose_metric: the role's own when `metric` is None). `tokens` is parsed
        (parse_tokens: a number or `all`); a role measured by logit-diff reads the IOI prompts unless
        `prompts` are given."""
        metric, why = choose_metric(role, metric)
        if "tokens" in fields:
            fields["tokens"] = parse_tokens(fields["tokens"])
        if metric == "logit-diff" and role is not None and fields.get("prompts") is None:
            fields["prompts"] = IOI  # the role's own prompts
        return cls(metric=metric, **fields), why

    def check_method(self, method: str, approx: str | None = None) -> None:
        """ConfigError for an unknown ablation method, or for a gradient estimate (`approx`) under a token
        budget: the estimate reads every token of the set."""
        check_choice(method, self.metric)
        if approx and self.tokens is not None:
            raise ConfigError("--approx reads every token of the evaluation set: leave out --tokens (or give all)")

    def with_budget(self, tokens: int | None) -> EvalSpec:
        return replace(self, tokens=tokens)


def ioi_prompts(loaded: LoadedModel, seed: int = 0) -> list[dict]:
    """The IOI prompts of the name-mover probe (seeded), as prompts-file dicts."""
    from headlens.scores.name_mover import ioi_prompts as build  # the IOI templates, needed only here

    found = build(loaded.tokenizer, loaded.bos_token_id, IOI_PROMPTS, seed)
    return [
        {"prompt": p["text"], "target": p["target"], "foil": p["foil"], "line": f"IOI prompt {i + 1}"}
        for i, p in enumerate(found)
    ]


def spaced_rows(lengths: list[int], tokens: int) -> list[int]:
    """The most sequences, evenly spaced (rows i * n // k), whose lengths sum to at most `tokens`
    (one at least)."""
    n = len(lengths)
    for k in range(n, 0, -1):
        rows = [i * n // k for i in range(k)]
        if sum(lengths[r] for r in rows) <= tokens or k == 1:
            return rows
    return []


def within_budget(evalset: EvalSet, tokens: int | None) -> EvalSet:
    """`evalset` when it reads no more than `tokens` tokens, else its evenly spaced sequences that fit
    (spaced_rows), with fresh bootstrap units and a description that states the budget."""
    lengths = evalset.mask.sum(1).tolist()  # [n_seq] tokens each sequence reads
    if tokens is None or sum(lengths) <= tokens:
        return evalset
    rows = spaced_rows(lengths, tokens)
    index = torch.tensor(rows)
    used = sum(lengths[r] for r in rows)
    digest = hashlib.sha256(f"{evalset.data_hash}|rows|{rows}".encode()).hexdigest()
    description = (
        f"{len(rows)} of {len(lengths)} sequences, evenly spaced ({used:,} tokens, a {tokens:,}-token budget): "
        f"{evalset.description}"
    )
    return EvalSet(
        evalset.input_ids[index],
        evalset.mask[index],
        evalset.counted[index],
        evalset.metric,
        digest,
        description,
        foils=None if evalset.foils is None else evalset.foils[index],
        reference_ids=evalset.reference_ids,
        reference_mask=evalset.reference_mask,
        reference_label=evalset.reference_label,
    )


def tokens_read(evalset: EvalSet) -> int:
    """Tokens the model reads for one run over the set."""
    return int(evalset.mask.sum())
