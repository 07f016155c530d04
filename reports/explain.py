"""What each score measures, its colour scale, its threshold and where its definition comes from.

Plain-language text shown next to every heatmap (from the message catalogue, headlens.reports.i18n).
Definitions and thresholds follow
the papers cited with each score; the thresholds here are the published ones and are replaced by the classifier's
own (`heads.attrs["thresholds"]`, or `headlens.labels.ClassifyConfig` defaults) when known.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from headlens.labels import ClassifyConfig
from headlens.reports.i18n import DEFAULT_LANG, t


@dataclass(frozen=True)
class ScoreInfo:
    """How one score column of the classifier's frame is drawn; its prose lives in the catalogue
    (i18n keys "score.<column>.title" / ".what" / ".source")."""

    column: str  # column of the heads frame
    threshold: float | None  # the labelling cut-off drawn on the heatmap (None: no label)
    vmin: float = 0.0  # colour scale, fixed per score so every report reads the same
    vmax: float = 1.0

    def title(self, lang: str = DEFAULT_LANG) -> str:
        """Heading on the page."""
        return t(f"score.{self.column}.title", lang)

    def what(self, lang: str = DEFAULT_LANG) -> str:
        """One or two plain sentences: what a high value means."""
        return t(f"score.{self.column}.what", lang)

    def source(self, lang: str = DEFAULT_LANG) -> str:
        """The paper / code the definition comes from."""
        return t(f"score.{self.column}.source", lang)


SCORES: tuple[ScoreInfo, ...] = (
    ScoreInfo("prev_token_score", None),  # Olsson et al. 2022; TransformerLens head detector
    ScoreInfo("current_token_score", None),  # Voita et al. 2019
    ScoreInfo("first_token_score", 0.3),  # Gu et al. 2024: alpha_1 > 0.3
    ScoreInfo("positional_share", 0.9),  # Voita et al. 2019: 90% of tokens
    ScoreInfo("duplicate_token_score", None),  # TransformerLens detect_head
    ScoreInfo("prefix_matching_score", None),  # Olsson et al. 2022
    ScoreInfo("copying_score", None, vmin=-1.0, vmax=1.0),  # Olsson et al. 2022: signed
    ScoreInfo("retrieval_score", 0.1),  # Wu et al. 2024: > 0.1
)

# ClassifyConfig field holding each score's labelling threshold (headlens.labels.label_head).
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
        config = asdict(ClassifyConfig())
    for column, name in CONFIG_FIELDS.items():
        if isinstance(config.get(name), (int, float)):
            found[column] = float(config[name])
    for column, value in (attrs.get("thresholds") or {}).items():
        if column in found and isinstance(value, (int, float)):
            found[column] = float(value)
    return found




# The scores that back each label, the first one ranking heads within the role (headlens.labels.label_head).
ROLE_EVIDENCE: dict[str, tuple[str, ...]] = {
    "previous_token": ("positional_share", "prev_token_score"),
    "current_token": ("positional_share", "current_token_score"),
    "positional": ("positional_share", "positional_offset"),
    "first_token": ("first_token_score",),
    "duplicate_token": ("duplicate_token_score",),
    "induction": ("prefix_matching_score", "copying_score"),
    "anti_induction": ("prefix_matching_score", "copying_score"),
    "retrieval": ("retrieval_score",),
}


def role_strength(row: dict, role: str) -> float:
    """The score ranking a head within `role` (-inf when the frame lacks it or it is NaN)."""
    value = row.get(ROLE_EVIDENCE[role][0])
    if not isinstance(value, (int, float)) or math.isnan(value):
        return float("-inf")
    return float(value)
