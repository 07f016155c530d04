"""What each score measures, its colour scale, its threshold and where its definition comes from.

Plain-language text shown next to every heatmap. Definitions and thresholds follow
REFERENCES.md; the thresholds here are the published ones and are replaced by the classifier's
own (`heads.attrs["thresholds"]`, or `headlens.classify.ClassifyConfig` defaults) when known.
"""

from __future__ import annotations

from dataclasses import dataclass

from headlens.classify import ClassifyConfig


@dataclass(frozen=True)
class ScoreInfo:
    """How one score column of the classifier's frame is drawn and explained."""

    column: str  # column of the heads frame
    title: str  # heading on the page
    what: str  # one or two plain sentences: what a high value means
    source: str  # the paper / code the definition comes from
    threshold: float | None  # the labelling cut-off drawn on the heatmap (None: no label)
    vmin: float = 0.0  # colour scale, fixed per score so every report reads the same
    vmax: float = 1.0


SCORES: tuple[ScoreInfo, ...] = (
    ScoreInfo("prev_token_score", "Previous-token score",
              "Mean attention from each token to the token just before it. A head near 1 reads the previous "
              "token, the first half of an induction circuit.",
              "Olsson et al. 2022, In-context Learning and Induction Heads (arXiv 2209.11895); TransformerLens "
              "head detector.", None),
    ScoreInfo("current_token_score", "Current-token score",
              "Mean attention from each token to itself (relative offset 0).",
              "Voita et al. 2019, Analyzing Multi-Head Self-Attention (arXiv 1905.09418), positional heads.", None),
    ScoreInfo("first_token_score", "First-token (attention sink) score",
              "Mean attention every query puts on position 0. Heads with a sink park their attention there when "
              "nothing else is relevant.",
              "Gu et al. 2024, When Attention Sink Emerges (arXiv 2410.10781): alpha_1 > 0.3; Xiao et al. 2023 "
              "(arXiv 2309.17453).", 0.3),
    ScoreInfo("positional_share", "Positional share",
              "Share of tokens whose strongest attention (position 0 excluded) falls at the head's dominant "
              "relative offset. At 0.9 or more the head is positional: it looks at a fixed distance.",
              "Voita et al. 2019 (arXiv 1905.09418): positional if the same relative position wins for at least "
              "90% of tokens.", 0.9),
    ScoreInfo("duplicate_token_score", "Duplicate-token score",
              "Mean attention from a token to earlier copies of the same token.",
              "TransformerLens detect_head 'duplicate_token_head'; IOI circuit, Wang et al. 2022.", None),
    ScoreInfo("prefix_matching_score", "Induction (prefix-matching) score",
              "On random tokens repeated several times, mean attention from a token to the token that followed "
              "its earlier occurrence ([A][B] ... [A] attends to [B]). Induction heads score high.",
              "Olsson et al. 2022 (arXiv 2209.11895): 25 random tokens repeated 4 times, BOS prepended.", None),
    ScoreInfo("copying_score", "Copying score",
              "Whether what the head writes raises the logit of the token it attends to (positive: copies, "
              "negative: suppresses, as anti-induction heads do).",
              "Olsson et al. 2022 (arXiv 2209.11895), copying via the direct path to the unembedding.", None,
              vmin=-1.0, vmax=1.0),
    ScoreInfo("retrieval_score", "Retrieval score",
              "Share of needle tokens the head copy-pastes: while the model reproduces a needle hidden in a "
              "haystack, the head's strongest attention lands on the very token being written.",
              "Wu et al. 2024, Retrieval Head Mechanistically Explains Long-Context Factuality (arXiv 2404.15574): "
              "retrieval head if the score > 0.1; protocol shrunk for short contexts.", 0.1),
)

# ClassifyConfig field holding each score's labelling threshold (headlens.classify.label_head).
CONFIG_FIELDS = {
    "positional_share": "positional_min",
    "first_token_score": "first_token_min",
    "duplicate_token_score": "duplicate_token_min",
    "prefix_matching_score": "prefix_matching_min",
    "copying_score": "copying_min",
    "retrieval_score": "retrieval_min",
}


def score_thresholds(attrs: dict | None = None) -> dict[str, float | None]:
    """Threshold per score column: the classifier's config in the frame's attrs (`attrs["config"]`), else
    ClassifyConfig's defaults, else the papers'; `attrs["thresholds"]` ({column: value}) overrides all."""
    attrs = attrs or {}
    found = {info.column: info.threshold for info in SCORES}
    config = attrs.get("config")
    if not isinstance(config, dict):
        try:
            from dataclasses import asdict


            config = asdict(ClassifyConfig())
        except ImportError:
            config = {}
    for column, name in CONFIG_FIELDS.items():
        if isinstance(config.get(name), (int, float)):
            found[column] = float(config[name])
    for column, value in (attrs.get("thresholds") or {}).items():
        if column in found and isinstance(value, (int, float)):
            found[column] = float(value)
    return found


ABLATION_TEXT = (
    "Zero ablation sets a head's output z (the input of the attention output projection) to zero and "
    "measures the change in next-token loss on the text: delta loss > 0 means the model needs the head. "
    "Olsson et al. 2022; Michel et al. 2019 (arXiv 1905.10650) for pruning. Later heads can compensate "
    "for an ablated one (self-repair, McDougall et al. 2023), so single-head deltas understate roles; "
    "the pruning curve shows the joint effect."
)
VALIDATION_TEXT = (
    "Our from-scratch multi-head attention recomputes each layer's pattern, z and attention output from "
    "the raw weights and is compared with the library (Hugging Face eager attention, sdpa, TransformerLens)."
)
TRAINING_TEXT = (
    "The embedded model was trained here. Induction heads form abruptly, together with a bump in the loss "
    "and a jump in in-context learning (ICL score = loss late in the context minus loss early in it; "
    "more negative is better): the phase change of Olsson et al. 2022 (arXiv 2209.11895)."
)
