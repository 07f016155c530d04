"""The labelling rules of classify: which labels each head's scores earn, under which thresholds.

Each kind's rule, thresholds and citation live in its headlens.classify.kinds entry; `label_head` applies them
all. The rules, by the published definitions:
- positional: one relative offset holds the head's maximum weight for >= positional_min (0.9) of
  tokens (Voita et al. 2019); previous-token at offset -1, current-token at offset 0;
- first_token, a *property*, not a role: mean attention on position 0 > first_token_min (0.3)
  (Gu et al. 2024). Most heads of a real model are sinks, whatever else they do (Xiao et al. 2023),
  so a sink is counted apart: "heads with a role" never counts a head that is only a sink;
- duplicate-token: >= duplicate_token_min of attention on earlier copies of the current token;
- on repeated random tokens (Olsson et al. 2022, arXiv 2209.11895), heads whose prefix-matching
  score is >= prefix_matching_min (0.4) are split by their direct-path copying score: induction
  heads copy (copying >= copying_min, 0.5), anti-induction heads suppress (copying <= -0.5), and
  *prefix-matching heads* do neither (|copying| < 0.5): they find the token after the earlier copy
  of the current one, as Olsson et al.'s prefix-matching heads do, without writing it to the logits;
- retrieval: copy-paste score > retrieval_min (0.1) on needle tests (Wu et al. 2024).
Every threshold is a ClassifyConfig field; `--threshold NAME=VALUE` sets one. `rank_heads` is the
one ordering of heads the CLI table and the report share (`rank_key`); `absent_roles` names, for each
role no head earned, the head highest on its ranking score (the CLI's notes, the report's findings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from headlens.classify import kinds
from headlens.classify.stability import N_RESAMPLES
from headlens.errors import ConfigError

LABELS = kinds.LABELS  # every label classify can give, in the order a head's list is written
ROLES, PROPERTIES = kinds.ROLES, kinds.PROPERTIES
# --threshold NAME=VALUE: NAME -> ClassifyConfig field.
THRESHOLDS = {th.name: th.field for th in kinds.THRESHOLDS}
DEFAULT_TOKEN_BUDGET = kinds.DEFAULT_TOKEN_BUDGET
DEFAULT_MAX_WINDOWS = kinds.DEFAULT_MAX_WINDOWS
MIN_BUDGET = 8  # a budget below this leaves no probe anything to measure


@dataclass(frozen=True)
class ProbeConfig:
    """Probe settings of `headlens.classify.classify_heads`. CLI flags map 1:1 to fields."""

    seed: int = 0  # seeds the random tokens and the needles
    n_seq: int = 8  # repeated-random-token sequences
    seq_len: int = 25  # period T of the random segment (Olsson et al.: 25)
    repeats: int = 4  # copies of the segment (Olsson et al.: 4); fewer if the budget is short (>= 2)
    token_low: int | None = None  # random ids from [token_low, token_high); None: probes.random_token_range
    token_high: int | None = None
    max_windows: int = DEFAULT_MAX_WINDOWS  # natural-text windows scored at most (headlens.classify.kinds)
    token_budget: int = DEFAULT_TOKEN_BUDGET  # longest text window / repeated sequence: min(budget, n_ctx)
    needle_budget: int | None = None  # longest needle test, min(budget, n_ctx); None: token_budget
    batch_size: int = 8  # sequences per forward pass
    max_offset: int = 8  # relative offsets 0..-max_offset get their own bucket in the Voita argmax test
    needles: bool = True  # run the needle-in-a-haystack probe (retrieval_score NaN when off)
    needle_len: int = 16  # needle tokens (restated + generated); shrunk to needle context // 8 when short
    needle_restate: int = 4  # needle tokens restated at the end of the prompt
    needle_depths: int = 5  # needle depths per test length (probes.even_depths): needle tests = depths x lengths
    syntax: str | None = None  # CoNLL-U treebank of the syntactic-head probe; "sample": the shipped one; None: not run
    resamples: int = N_RESAMPLES  # bootstrap resamples of the intervals and stabilities; 0: none
    strict: bool = False  # keep only stable labels (stability >= headlens.classify.stability.STABLE_MIN)

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str):
            if not ok:
                raise ConfigError(f"{name} = {getattr(self, name)!r} is out of range: {rule}")

        for name in ("n_seq", "seq_len", "batch_size", "max_windows", "max_offset", "needle_len", "needle_depths"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, "an integer >= 1")
        for name in ("token_budget", "needle_budget"):
            value = getattr(self, name)
            need(
                value is None and name == "needle_budget" or isinstance(value, int) and value >= MIN_BUDGET,
                name,
                f"an integer >= {MIN_BUDGET} (tokens per probe sequence)",
            )
        need(isinstance(self.repeats, int) and self.repeats >= 2, "repeats", "an integer >= 2")
        need(isinstance(self.resamples, int) and self.resamples >= 0, "resamples", "an integer >= 0")
        need(isinstance(self.seed, int) and self.seed >= 0, "seed", "an integer >= 0")
        need(
            isinstance(self.needle_restate, int) and 1 <= self.needle_restate < self.needle_len,
            "needle_restate",
            f"an integer in [1, needle_len - 1 = {self.needle_len - 1}]",
        )
        for th in kinds.THRESHOLDS:
            value = getattr(self, th.field)
            need(isinstance(value, (int, float)) and 0.0 <= value <= 1.0, th.field, "a number in [0, 1]")


DEFAULTS = {th.field: th.default for th in kinds.THRESHOLDS}  # threshold field -> its registry default


@dataclass(frozen=True)
class ClassifyConfig(ProbeConfig):
    """Probe settings and label thresholds of classify_heads: ProbeConfig's fields, then one float per threshold
    of the registry (headlens.classify.kinds.THRESHOLDS, where each default and its citation are declared; the
    fields are written out so that type checkers see them, and tests/test_kinds.py checks them against the
    registry). CLI flags map 1:1 to fields."""

    positional_min: float = DEFAULTS["positional_min"]
    first_token_min: float = DEFAULTS["first_token_min"]
    duplicate_token_min: float = DEFAULTS["duplicate_token_min"]
    prefix_matching_min: float = DEFAULTS["prefix_matching_min"]
    copying_min: float = DEFAULTS["copying_min"]
    retrieval_min: float = DEFAULTS["retrieval_min"]
    successor_min: float = DEFAULTS["successor_min"]
    cs_ov_min: float = DEFAULTS["cs_ov_min"]
    cs_qk_min: float = DEFAULTS["cs_qk_min"]
    io_attention_min: float = DEFAULTS["io_attention_min"]
    name_copy_min: float = DEFAULTS["name_copy_min"]
    rare_word_min: float = DEFAULTS["rare_word_min"]
    syntactic_min: float = DEFAULTS["syntactic_min"]


def config_with_thresholds(config: ClassifyConfig, pairs) -> ClassifyConfig:
    """A copy of `config` with `NAME=VALUE` strings applied (NAME from THRESHOLDS or a field name)."""
    known = sorted(THRESHOLDS)
    updates: dict[str, Any] = {}  # field -> value, checked by __post_init__
    for pair in pairs:
        name, sep, value = str(pair).partition("=")
        name = name.strip()
        field = THRESHOLDS.get(name, name if name in THRESHOLDS.values() else None)
        if not sep or field is None:
            raise ConfigError(f"unknown threshold {name!r}: expected NAME=VALUE with NAME one of {', '.join(known)}")
        try:
            updates[field] = float(value)
        except ValueError:
            raise ConfigError(f"threshold {name} = {value!r} is not a number: give a value in [0, 1]") from None
    return replace(config, **updates)


def label_head(scores: dict, config: ClassifyConfig) -> list[str]:
    """The labels one head's scores earn (LABELS order), by each kind's rule. NaN scores earn nothing."""
    return [kind.label for kind in kinds.KINDS if kind.rule(scores, config)]


def roles_of(labels) -> list[str]:
    """The roles among `labels` (properties such as first_token left out)."""
    return [label for label in labels if label in ROLES]


def head_strength(row: dict, label: str) -> float:
    """The score ranking a head within `label` (-inf when the row lacks it or it is NaN)."""
    value = row.get(kinds.BY_LABEL[label].score)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return float("-inf")
    return float(value)


def rank_key(labels, row: dict) -> tuple:
    """Sort key of one head: heads with a role first, grouped by their first role (LABELS order),
    strongest first within it; then heads with only a property, the same way; then the rest."""
    labels = [label for label in labels if label in kinds.BY_LABEL]
    roles = roles_of(labels)
    if roles:
        return 0, LABELS.index(roles[0]), -head_strength(row, roles[0])
    if labels:
        return 1, LABELS.index(labels[0]), -head_strength(row, labels[0])
    return 2, 0, 0.0


@dataclass(frozen=True)
class Absence:
    """A role no head of a frame earned, and the head highest on the kind's ranking score."""

    label: str
    head: str | None  # "L.H" with the highest ranking score; None: no head has one (the probe gave no scores)
    values: tuple[tuple[str, float, float | None], ...]  # (evidence column, that head's value, its cut-off)

    def describe(self) -> str:
        """In English, for the command line: "highest successor_score at 23.3: successor_score 0.21
        (cut-off 0.5)" (an integer score such as an offset as the integer it is)."""
        if self.head is None:
            return "the probe gave no scores"
        parts = ", ".join(
            f"{column} {int(value) if kinds.BY_COLUMN[column].integer else f'{value:.2f}'}"
            + (f" (cut-off {cut:g})" if cut is not None else "")
            for column, value, cut in self.values
        )
        return f"highest {kinds.BY_LABEL[self.label].score} at {self.head}: {parts}"


def cut_offs(meta: dict | None) -> dict[str, float]:
    """Score column -> the cut-off a classification's labels were given under: its config (`meta["config"]`,
    a dict of ClassifyConfig fields) where that holds the field, else the registry's default."""
    config = (meta or {}).get("config")
    config = config if isinstance(config, dict) else {}
    found = {}
    for column, th in kinds.THRESHOLD_OF.items():
        value = config.get(th.field, th.default)
        found[column] = float(value if isinstance(value, (int, float)) else th.default)
    return found


def absent_roles(frame: pd.DataFrame, meta: dict | None = None) -> list[Absence]:
    """Every role of the registry (ROLES order) that no head of `frame` carries and whose ranking score
    the frame has, with the head that scores highest on it and that head's evidence values beside their
    cut-offs (those of `meta`, the classification's meta: cut_offs): why the kind is absent. Roles whose
    probe did not run (its source column SOURCE_NOT_RUN) are left out; a frame without labels names none."""
    if "labels" not in frame or frame.empty:
        return []
    carried = {label for value in frame["labels"] for label in label_list(value)}
    cuts = cut_offs(meta)
    frame = frame.sort_values(["layer", "head"]).reset_index(drop=True)  # ties go to the first head
    absent = []
    for label in ROLES:
        kind = kinds.BY_LABEL[label]
        if label in carried or kind.score not in frame:
            continue
        source = kinds.SOURCE_COLUMNS.get(kinds.BY_COLUMN[kind.score].probe)
        if source in frame and (frame[source] == kinds.SOURCE_NOT_RUN).all():
            continue  # its probe was switched off or not asked for: nothing to say of the heads
        ranking = pd.to_numeric(frame[kind.score], errors="coerce")  # [heads]
        if ranking.isna().all():
            absent.append(Absence(label, None, ()))
            continue
        row = frame.loc[ranking.idxmax()]
        values = tuple(
            (column, float(row[column]), cuts.get(column))
            for column in kind.evidence
            if column in frame and isinstance(row[column], (int, float, np.number)) and not math.isnan(row[column])
        )
        absent.append(Absence(label, f"{int(row['layer'])}.{int(row['head'])}", values))
    return absent


def label_list(value) -> list[str]:
    """Labels as a list: classify_heads gives a list; a frame read back from CSV/JSON may hold "a;b" or NaN."""
    if isinstance(value, str):
        return [
            part.strip() for part in value.strip("[]").replace("'", "").replace(";", ",").split(",") if part.strip()
        ]
    if isinstance(value, (list, tuple, np.ndarray)):
        return [str(v) for v in value]
    return []


def rank_heads(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` in rank_key order, (layer, head) breaking ties (a frame without labels: (layer, head))."""
    frame = frame.sort_values(["layer", "head"]).reset_index(drop=True)
    labels = [label_list(v) for v in frame["labels"]] if "labels" in frame else [[]] * len(frame)
    keys = [rank_key(names, row) for names, row in zip(labels, frame.to_dict("records"), strict=True)]
    order = sorted(range(len(frame)), key=lambda i: (*keys[i], i))
    return frame.iloc[order].reset_index(drop=True)
