"""The labelling rules of classify: which label each head's scores earn, under which thresholds.

A head is labelled from its scores alone (`label_head`), by the published definitions: positional,
previous- and current-token heads (Voita et al. 2019: one relative offset for >= 90% of tokens),
first-token sinks (Gu et al. 2024), duplicate-token and induction heads (Olsson et al. 2022:
prefix matching and copying; anti-induction when the copying is negative) and retrieval heads (Wu
et al. 2024). Every threshold is a ClassifyConfig field; `--threshold NAME=VALUE` sets one.
`rank_heads` orders a classified frame labelled heads first, strongest first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from headlens.errors import ConfigError

# Every label classify can give, in the order a head's list is written.
LABELS = ("previous_token", "current_token", "positional", "first_token", "duplicate_token", "induction",
          "anti_induction", "retrieval")
# --threshold NAME=VALUE: NAME -> ClassifyConfig field.
THRESHOLDS = {"positional": "positional_min", "first_token": "first_token_min",
              "duplicate_token": "duplicate_token_min", "prefix_matching": "prefix_matching_min",
              "copying": "copying_min", "retrieval": "retrieval_min"}


@dataclass(frozen=True)
class ClassifyConfig:
    """Probe settings of `headlens.classify.classify_heads` and the label thresholds. CLI flags map 1:1 to fields."""

    seed: int = 0  # seeds the random tokens and the needles
    n_seq: int = 8  # repeated-random-token sequences
    seq_len: int = 25  # period T of the random segment (Olsson et al.: 25)
    repeats: int = 4  # copies of the segment (Olsson et al.: 4); fewer if the context is short (>= 2)
    token_low: int | None = None  # random ids from [token_low, token_high); None: probes.random_token_range
    token_high: int | None = None
    max_windows: int = 32  # natural-text windows scored at most (the rest is reported, not silently cut)
    batch_size: int = 8  # sequences per forward pass
    max_offset: int = 8  # relative offsets 0..-max_offset get their own bucket in the Voita argmax test
    needles: bool = True  # run the needle-in-a-haystack probe (retrieval_score NaN when off)
    needle_len: int = 16  # needle tokens (restated + generated); shrunk to n_ctx // 8 on short contexts
    needle_restate: int = 4  # needle tokens restated at the end of the prompt
    positional_min: float = 0.9  # Voita et al. 2019: max weight at one relative offset for >= 90% of tokens
    first_token_min: float = 0.3  # Gu et al. 2024: a sink if mean A[t, 0] > 0.3
    duplicate_token_min: float = 0.4  # no published cut-off: 40% of attention on earlier copies (chance ~ 1/pos)
    prefix_matching_min: float = 0.4  # no published cut-off: 40% on prefix-matching targets (chance ~ 1/pos)
    copying_min: float = 0.5  # attended token's logit above the vocabulary's 75th (Gaussian) percentile
    retrieval_min: float = 0.1  # Wu et al. 2024: a retrieval head if its score > 0.1

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str):
            if not ok:
                raise ConfigError(f"{name} = {getattr(self, name)!r} is out of range: {rule}")

        for name in ("n_seq", "seq_len", "batch_size", "max_windows", "max_offset", "needle_len"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, "an integer >= 1")
        need(isinstance(self.repeats, int) and self.repeats >= 2, "repeats", "an integer >= 2")
        need(isinstance(self.seed, int) and self.seed >= 0, "seed", "an integer >= 0")
        need(isinstance(self.needle_restate, int) and 1 <= self.needle_restate < self.needle_len,
             "needle_restate", f"an integer in [1, needle_len - 1 = {self.needle_len - 1}]")
        for name in ("positional_min", "first_token_min", "duplicate_token_min", "prefix_matching_min",
                     "copying_min", "retrieval_min"):
            value = getattr(self, name)
            need(isinstance(value, (int, float)) and 0.0 <= value <= 1.0, name, "a number in [0, 1]")


def config_with_thresholds(config: ClassifyConfig, pairs) -> ClassifyConfig:
    """A copy of `config` with `NAME=VALUE` strings applied (NAME from THRESHOLDS or a field name)."""
    known = sorted(THRESHOLDS)
    updates = {}
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
    """The labels one head's scores earn (LABELS order). NaN scores earn nothing."""
    labels = set()
    if scores["positional_share"] >= config.positional_min:
        labels.add("positional")
        if scores["positional_offset"] == -1:
            labels.add("previous_token")
        elif scores["positional_offset"] == 0:
            labels.add("current_token")
    if scores["first_token_score"] > config.first_token_min:
        labels.add("first_token")
    if scores["duplicate_token_score"] >= config.duplicate_token_min:
        labels.add("duplicate_token")
    if scores["prefix_matching_score"] >= config.prefix_matching_min:
        # Olsson et al.: induction = prefix matching AND copying; prefix matching while
        # suppressing the attended token is anti-induction.
        if scores["copying_score"] >= config.copying_min:
            labels.add("induction")
        elif scores["copying_score"] <= -config.copying_min:
            labels.add("anti_induction")
    if scores["retrieval_score"] > config.retrieval_min:
        labels.add("retrieval")
    return [label for label in LABELS if label in labels]


# The score that backs each label: "strongest first" orders labelled heads by it.
LABEL_SCORE = {"previous_token": "positional_share", "current_token": "positional_share",
                "positional": "positional_share", "first_token": "first_token_score",
                "duplicate_token": "duplicate_token_score", "induction": "prefix_matching_score",
                "anti_induction": "prefix_matching_score", "retrieval": "retrieval_score"}


def rank_heads(frame: pd.DataFrame) -> pd.DataFrame:
    """Labelled heads first, strongest first (the largest score backing any of a head's labels),
    then the unlabelled heads in (layer, head) order."""
    strength = [max((row[LABEL_SCORE[label]] for label in row["labels"]), default=float("-inf"))
                for row in frame.to_dict("records")]
    ranked = frame.assign(_strength=strength, _labelled=[bool(labels) for labels in frame["labels"]])
    ranked = ranked.sort_values(["_labelled", "_strength", "layer", "head"], ascending=[False, False, True, True],
                                kind="stable")
    return ranked.drop(columns=["_strength", "_labelled"]).reset_index(drop=True)
