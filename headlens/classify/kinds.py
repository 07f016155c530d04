"""The registry of head kinds: every fact about a kind of head, in one entry.

Each Kind declares its label rule and the thresholds it reads (ClassifyConfig fields, settable with
`--threshold NAME=VALUE`), the Scores it owns (frame columns, each with the probe that measures it,
its std column and colour scale), its evidence columns (the first ranks heads of the kind), whether
it is a *role* (what a head does) or a *property* (a trait many heads share, counted apart), its
colour on the report's head map, its catalogue keys and its citation. The stages read it from here:
labelling (headlens.classify.labels), the classify frame (headlens.classify), the CLI table, the report's
findings, head map, heatmaps and explanations, and the inline views.

Roles and properties: a role is a computation a head performs on the input (copying the previous
token, completing a repeated prefix, retrieving a needle); a property is a trait that goes with
almost any role. The first-token sink is a property: most heads of a real model park their spare
attention on position 0 (Xiao et al. 2023; Gu et al. 2024 find it in 77% of GPT2-XL's heads), so it
keeps its score and label but does not count as a role and is summarised, not listed.

How to add a kind
1. Write its score module under headlens/scores/ (tensors in, tensors out). If no probe of PROBES
   gives the input it needs, add a probe: a function `ProbeRun -> ProbeResult` in
   headlens.classify.kind_runs (the first four probes are in headlens.classify.runs) returning its
   score columns, each [n_layers, n_heads], and their `<column>_std` where it has one; name it
   "module:function" in PROBES (imported when it runs).
2. Add one Kind to KINDS: its label, rule, the Score(s) and Threshold(s) it owns, its evidence,
   colour and citation. The frame, the labels, `--threshold`, the CLI table, the report and the
   inline views pick it up from here.
3. Add its catalogue keys to reports/messages_en.json and messages_es.json: `role.<label>` and
   `role_what.<label>`, and for each new score `score.<column>.title` / `.what` / `.source` and
   `short.<column>`. tests/test_kinds.py checks every entry is complete.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Tokens per probe sequence unless told otherwise (ClassifyConfig.token_budget): the shipped tiny
# model's whole context, so every model is probed with the sequences the shipped models are, whatever
# its context (Olsson et al.'s repeated tokens take 101; needle tests 64 to 256). BENCHMARKS.md
# compares the labels of a real model at this budget and at 4x it.
DEFAULT_TOKEN_BUDGET = 256
# Natural-text windows scored at most (ClassifyConfig.max_windows; the rest is reported, not silently cut):
# 16 windows of 256 tokens gave SmolLM2 the labels 32 give, and Gemma 3 270M all of them but one sink
# label (head 8.2's first_token, at its threshold); BENCHMARKS.md.
DEFAULT_MAX_WINDOWS = 16
# A probe's source (its frame column, Probe.source_column) when it did not run: switched off or not asked for.
SOURCE_NOT_RUN = "not_run"


@dataclass(frozen=True)
class Probe:
    """One input the classifier runs: `run(ProbeRun) -> ProbeResult`, its frame column of sources."""

    name: str
    function: str  # "module:function" of the probe, imported when it runs (this registry stays light)
    source_column: str | None  # frame column naming its input's source (None: reads the weights)
    reads_text: bool = False  # reads the natural text (run again for each text --compare-texts reads)

    def run(self, run):
        """Run the probe on a headlens.classify.runs.ProbeRun; returns its ProbeResult."""
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)(run)


@dataclass(frozen=True)
class Score:
    """One score column of the classify frame."""

    column: str  # `<kind>_score` (or an evidence value such as positional_offset)
    probe: str  # PROBES key of the probe that measures it
    std: str | None = None  # column of its spread across sequences / tests
    vmin: float = 0.0  # colour scale of its heatmap, fixed so reports compare by eye
    vmax: float = 1.0
    heatmap: bool = True  # drawn as a layers x heads heatmap in the report and inline view
    table: bool = True  # shown in the CLI table and the report's label table
    integer: bool = False  # stored as int (an offset), not float


# Where a cut-off comes from. "paper": the value a paper labels with (its note cites it). "choice": no
# paper gives one; the note says what the value means against chance. Neither was tuned on a model: the
# planted models (tests/helpers/planted.py) check that every planted head clears its cut-off and no decoy
# reaches one, and the report plots, per role, how many heads each nearby cut-off would label.
ORIGINS = ("paper", "choice")


@dataclass(frozen=True)
class Threshold:
    """One labelling cut-off: a ClassifyConfig field, `--threshold name=VALUE`."""

    name: str  # name given to --threshold
    field: str  # ClassifyConfig field
    default: float
    column: str  # the score it cuts (drawn on that score's heatmap)
    note: str  # where the value comes from
    also: tuple[str, ...] = ()  # further score columns another kind's rule cuts at the same value
    origin: str = "choice"  # ORIGINS: a paper's published cut-off, or our choice (the note says why)


@dataclass(frozen=True)
class Kind:
    """One label classify can give a head."""

    label: str
    rule: Callable[[Mapping, object], bool]  # (a head's scores, ClassifyConfig) -> earns the label
    evidence: tuple[str, ...]  # score columns shown as evidence; the first ranks heads of the kind
    citation: str
    colour: str  # head-map colour (roles); properties are marked, not coloured
    role: bool = True  # False: a property (counted and summarised apart from the roles)
    scores: tuple[Score, ...] = ()  # score columns this kind owns (others may read them)
    thresholds: tuple[Threshold, ...] = ()  # cut-offs this kind owns (others may read them)

    @property
    def score(self) -> str:
        """The column ranking heads of this kind, strongest first."""
        return self.evidence[0]

    @property
    def name_key(self) -> str:
        """Catalogue key of the kind's name ("Induction heads")."""
        return f"role.{self.label}"

    @property
    def what_key(self) -> str:
        """Catalogue key of the kind's one-sentence explanation."""
        return f"role_what.{self.label}"


PROBES: dict[str, Probe] = {  # run in this order: the text probe fills the needles' haystack
    "text": Probe("text", "headlens.classify.runs:score_text", "text_source", reads_text=True),
    "repeats": Probe("repeats", "headlens.classify.runs:score_repeats", "repeats_source"),
    "needles": Probe("needles", "headlens.classify.runs:score_needles", "needles_source", reads_text=True),
    "weights": Probe("weights", "headlens.classify.runs:score_weights", None),
    "successor": Probe("successor", "headlens.classify.kind_runs:probe_successor", None),
    "copy_suppression": Probe(
        "copy_suppression",
        "headlens.classify.kind_runs:probe_copy_suppression",
        "copy_suppression_source",
        reads_text=True,
    ),
    "ioi": Probe("ioi", "headlens.classify.kind_runs:probe_name_mover", "ioi_source"),
}


# Label rules: NaN scores compare False and earn nothing. Written with `&`, not `and`, so that one rule
# labels a head's scalar scores and, elementwise, arrays of resampled scores (headlens.classify.stability).
def _positional(s, c) -> bool:
    return s["positional_share"] >= c.positional_min


def _induction(s, c) -> bool:
    return (s["prefix_matching_score"] >= c.prefix_matching_min) & (s["copying_score"] >= c.copying_min)


def _anti_induction(s, c) -> bool:
    return (s["prefix_matching_score"] >= c.prefix_matching_min) & (s["copying_score"] <= -c.copying_min)


def _prefix_matching(s, c) -> bool:
    return (s["prefix_matching_score"] >= c.prefix_matching_min) & (abs(s["copying_score"]) < c.copying_min)


def _ioi_attends(s, c) -> bool:
    return (s["io_attention"] >= c.io_attention_min) & (s["io_attention"] > s["s_attention"])


VOITA = "Voita et al. 2019, arXiv 1905.09418"
IOI = "Wang et al. 2022, arXiv 2211.00593"
OLSSON = "Olsson et al. 2022, arXiv 2209.11895"
KINDS: tuple[Kind, ...] = (
    # Previous-token heads of a real model can sit just above the positional cut-off: on another kind of text their
    # argmax share at offset -1 moves across it while the offset and their previous-token mass hardly change (SmolLM2's
    # 17.8, 19.3 and 19.8 on the GPL-3 licence, 19.3 and 19.8 on the shipped Spanish prose, against the shipped English
    # text; the licence's numbered sections and repeated words do not explain it). The bootstrap over one text's windows
    # says how sure a label is on text like that one; `classify --compare-texts` measures other kinds of text. The
    # causal check (benchmarks/previous_token_causal.py: each head's write path-patched into the induction heads' keys,
    # against the other heads of its layer) backs 16.0, 17.8 and 19.3, each far above every other head of its layer, so
    # the flip of 17.8 and 19.3 is the probe's miss; it does not back 19.8, whose key path carries nothing. The argmax
    # share on random tokens, where the previous token is known, labels 16.0, 17.8 and 19.3 and not 19.8, as the causal
    # check does; the probe still reads natural text, as Voita et al. define the head, until random tokens are checked
    # against the causal test on every head, not four.
    # The measurements behind this entry: BENCHMARKS.md, "Labels that say how sure they are".
    Kind(
        "previous_token",
        lambda s, c: _positional(s, c) & (s["positional_offset"] == -1),
        ("positional_share", "prev_token_score"),
        VOITA,
        "#1f77b4",
        scores=(Score("prev_token_score", "text", "prev_token_std"),),
    ),
    Kind(
        "current_token",
        lambda s, c: _positional(s, c) & (s["positional_offset"] == 0),
        ("positional_share", "current_token_score"),
        VOITA,
        "#aec7e8",
        scores=(Score("current_token_score", "text", "current_token_std", table=False),),
    ),
    Kind(
        "positional",
        _positional,
        ("positional_share", "positional_offset"),
        VOITA,
        "#9edae5",
        scores=(Score("positional_offset", "text", heatmap=False, integer=True), Score("positional_share", "text")),
        thresholds=(
            Threshold(
                "positional",
                "positional_min",
                0.9,
                "positional_share",
                "Voita et al. 2019: max weight at one relative offset for >= 90% of tokens",
                origin="paper",
            ),
        ),
    ),
    Kind(
        "first_token",
        lambda s, c: s["first_token_score"] > c.first_token_min,
        ("first_token_score",),
        "Gu et al. 2024, arXiv 2410.10781; Xiao et al. 2023, arXiv 2309.17453",
        "#c7c7c7",
        role=False,
        scores=(Score("first_token_score", "text", "first_token_std"),),
        thresholds=(
            Threshold(
                "first_token",
                "first_token_min",
                0.3,
                "first_token_score",
                "Gu et al. 2024: a sink if mean A[t, 0] > 0.3",
                origin="paper",
            ),
        ),
    ),
    Kind(
        "duplicate_token",
        lambda s, c: s["duplicate_token_score"] >= c.duplicate_token_min,
        ("duplicate_token_score",),
        OLSSON,
        "#2ca02c",
        scores=(Score("duplicate_token_score", "repeats", "duplicate_token_std"),),
        thresholds=(
            Threshold(
                "duplicate_token",
                "duplicate_token_min",
                0.4,
                "duplicate_token_score",
                "no published cut-off: 40% of attention on earlier copies (chance ~ 1/pos)",
            ),
        ),
    ),
    Kind(
        "induction",
        _induction,
        ("prefix_matching_score", "copying_score"),
        OLSSON,
        "#d62728",
        scores=(
            Score("prefix_matching_score", "repeats", "prefix_matching_std"),
            Score("copying_score", "repeats", "copying_std", vmin=-1.0),
            Score("ov_copying_score", "weights", heatmap=False),
        ),
        thresholds=(
            Threshold(
                "prefix_matching",
                "prefix_matching_min",
                0.4,
                "prefix_matching_score",
                "no published cut-off: 40% on prefix-matching targets (chance ~ 1/pos)",
            ),
            Threshold(
                "copying",
                "copying_min",
                0.5,
                "copying_score",
                "attended token's logit above the vocabulary's 75th (Gaussian) percentile",
            ),
        ),
    ),
    Kind("anti_induction", _anti_induction, ("prefix_matching_score", "copying_score"), OLSSON, "#9467bd"),
    Kind("prefix_matching", _prefix_matching, ("prefix_matching_score", "copying_score"), OLSSON, "#ff7f0e"),
    # Retrieval's stability is the needle probe's sample size (ClassifyConfig.needle_depths: depths x 3 test lengths,
    # one needle each). A small model retrieves only some of the tests, so at the default depths a score near the
    # cut-off rests on a handful of retrieved tests and moves with the needle seed and with bfloat16's greedy tokens;
    # more depths shrink its standard error as 1/sqrt(retrieved tests), and the heads that still flip score at the
    # cut-off at every size and are marked borderline. More depths cost classify time in step, so the default stays
    # small and `--needle-depths` buys agreement; BENCHMARKS.md ("Why SmolLM2's retrieval labels") has the measurements.
    Kind(
        "retrieval",
        lambda s, c: s["retrieval_score"] > c.retrieval_min,
        ("retrieval_score",),
        "Wu et al. 2024, arXiv 2404.15574",
        "#e377c2",
        scores=(Score("retrieval_score", "needles", "retrieval_std"),),
        thresholds=(
            Threshold(
                "retrieval",
                "retrieval_min",
                0.1,
                "retrieval_score",
                "Wu et al. 2024: a retrieval head if its score > 0.1",
                origin="paper",
            ),
        ),
    ),
    Kind(
        "successor",
        lambda s, c: s["successor_score"] >= c.successor_min,
        ("successor_score",),
        "Gould et al. 2023, arXiv 2312.09230",
        "#bcbd22",
        scores=(Score("successor_score", "successor"),),
        thresholds=(
            Threshold(
                "successor",
                "successor_min",
                0.5,
                "successor_score",
                "no published cut-off: successor first on half the ordinal pairs (chance 1/26-1/7)",
            ),
        ),
    ),
    Kind(
        "copy_suppression",
        lambda s, c: (s["cs_ov_score"] >= c.cs_ov_min) & (s["cs_qk_score"] >= c.cs_qk_min),
        ("cs_ov_score", "cs_qk_score", "predicted_attention"),
        "McDougall et al. 2023, arXiv 2310.04625",
        "#8c564b",
        scores=(
            Score("cs_ov_score", "copy_suppression", "cs_ov_score_std"),
            Score("cs_qk_score", "copy_suppression", "cs_qk_score_std"),
            # shown as evidence, not a cut-off: a behavioural mean on natural text, not the paper's
            # quantity (headlens.scores.copy_suppression)
            Score("predicted_attention", "copy_suppression", "predicted_attention_std"),
        ),
        thresholds=(
            Threshold(
                "cs_ov",
                "cs_ov_min",
                0.5,
                "cs_ov_score",
                "McDougall et al.'s OV criterion (own logit in the bottom 10 of W_U W_OV W_EE); they give no"
                " cut-off: most of the vocabulary (chance 10/d_vocab)",
            ),
            Threshold(
                "cs_qk",
                "cs_qk_min",
                0.5,
                "cs_qk_score",
                "McDougall et al.'s QK criterion (own key in the top 10 of W_U^T W_Q W_K^T W_EE^T); they give"
                " no cut-off: most of the vocabulary (chance 10/d_vocab), as for the OV criterion",
            ),
        ),
    ),
    Kind(
        "name_mover",
        lambda s, c: _ioi_attends(s, c) & (s["name_copy_score"] >= c.name_copy_min),
        ("io_attention", "s_attention", "name_copy_score", "ioi_direct_effect"),
        IOI,
        "#17becf",
        scores=(
            Score("io_attention", "ioi", "io_attention_std"),
            Score("s_attention", "ioi", "s_attention_std", table=False),
            Score("name_copy_score", "ioi"),
            # logits, signed: what the head writes straight into logit(IO) - logit(S) at END
            Score("ioi_direct_effect", "ioi", "ioi_direct_effect_std", vmin=-2.0, vmax=2.0),
        ),
        thresholds=(
            Threshold(
                "io_attention",
                "io_attention_min",
                0.2,
                "io_attention",
                "no published cut-off: END to IO at 3x an even spread over a ~15-token prompt",
            ),
            Threshold(
                "name_copy",
                "name_copy_min",
                0.5,
                "name_copy_score",
                "no published cut-off: Wang et al.'s movers copy > 90% of names, most heads < 20%",
                also=("name_negative_copy_score",),  # the negative name movers' cut-off
            ),
        ),
    ),
    Kind(
        "negative_name_mover",
        lambda s, c: _ioi_attends(s, c) & (s["name_negative_copy_score"] >= c.name_copy_min),
        ("io_attention", "s_attention", "name_negative_copy_score", "ioi_direct_effect"),
        IOI,
        "#ff9896",
        scores=(Score("name_negative_copy_score", "ioi"),),
    ),
)

# Rare-word and syntactic heads (Voita et al. 2019; Clark et al. 2019): their probes and kinds.
PROBES["rare_word"] = Probe("rare_word", "headlens.classify.kind_runs:probe_rare_word", None, reads_text=True)
PROBES["syntactic"] = Probe("syntactic", "headlens.classify.kind_runs:probe_syntactic", "syntax_source")
KINDS = KINDS + (
    Kind(
        "rare_word",
        lambda s, c: s["rare_word_score"] >= c.rare_word_min,
        ("rare_word_score",),
        VOITA,
        "#c49c94",
        scores=(Score("rare_word_score", "rare_word"),),
        thresholds=(
            Threshold(
                "rare_word",
                "rare_word_min",
                0.5,
                "rare_word_score",
                "Voita et al. 2019 (their head: 66% of sentences); ours: max weight on the rarest word in half",
            ),
        ),
    ),
    Kind(
        "syntactic",
        lambda s, c: s["syntactic_score"] >= c.syntactic_min,
        ("syntactic_score", "syntactic_accuracy"),
        "Voita et al. 2019, arXiv 1905.09418; Clark et al. 2019, arXiv 1906.04341",
        "#c5b0d5",
        scores=(
            Score("syntactic_score", "syntactic", vmin=-0.5, vmax=0.5),
            Score("syntactic_accuracy", "syntactic", table=False),
        ),
        thresholds=(
            Threshold(
                "syntactic",
                "syntactic_min",
                0.1,
                "syntactic_score",
                "Voita et al. 2019: accuracy >= 10 points above the best fixed-offset baseline",
                origin="paper",
            ),
        ),
    ),
)

# Derived tables: read these, never restate them.
BY_LABEL: dict[str, Kind] = {kind.label: kind for kind in KINDS}
LABELS: tuple[str, ...] = tuple(kind.label for kind in KINDS)  # the order a head's labels are written in
ROLES: tuple[str, ...] = tuple(kind.label for kind in KINDS if kind.role)
PROPERTIES: tuple[str, ...] = tuple(kind.label for kind in KINDS if not kind.role)
SCORES: tuple[Score, ...] = tuple(score for kind in KINDS for score in kind.scores)
BY_COLUMN: dict[str, Score] = {score.column: score for score in SCORES}
SCORE_COLUMNS: list[str] = [score.column for score in SCORES]
STD_COLUMNS: list[str] = [score.std for score in SCORES if score.std]
TABLE_COLUMNS: list[str] = [score.column for score in SCORES if score.table]
THRESHOLDS: tuple[Threshold, ...] = tuple(th for kind in KINDS for th in kind.thresholds)
# score column -> the cut-off labelling cuts it at
THRESHOLD_OF: dict[str, Threshold] = {column: th for th in THRESHOLDS for column in (th.column, *th.also)}
SOURCE_COLUMNS: dict[str, str] = {p.name: p.source_column for p in PROBES.values() if p.source_column}


def _check_registry() -> None:
    """Every column a kind reads is a score some kind owns; every score's probe exists (import-time)."""
    for kind in KINDS:
        missing = [column for column in kind.evidence if column not in BY_COLUMN]
        if missing:
            raise ValueError(f"head kind {kind.label!r} reads unknown score columns {missing}")
    for th in THRESHOLDS:
        unknown = [column for column in (th.column, *th.also) if column not in BY_COLUMN]
        if unknown:
            raise ValueError(f"threshold {th.name!r} cuts unknown score columns {unknown}")
    for score in SCORES:
        if score.probe not in PROBES:
            raise ValueError(f"score {score.column!r} names unknown probe {score.probe!r}")


_check_registry()
