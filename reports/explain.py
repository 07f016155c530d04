"""What each score measures, its colour scale, its threshold and where its definition comes from.

Plain-language text shown next to every heatmap (from the message catalogue, headlens.reports.i18n).
Columns, colour scales, thresholds and evidence come from the registry of head kinds
(headlens.classify.kinds); a report draws the thresholds its classifier used (the classification's `meta["config"]`),
else the registry's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from headlens.classify import kinds
from headlens.classify.labels import cut_offs, head_strength
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


# One per heatmap score of the registry (headlens.classify.kinds.SCORES), its default threshold from there.
SCORES: tuple[ScoreInfo, ...] = tuple(
    ScoreInfo(
        score.column,
        kinds.THRESHOLD_OF[score.column].default if score.column in kinds.THRESHOLD_OF else None,
        vmin=score.vmin,
        vmax=score.vmax,
    )
    for score in kinds.SCORES
    if score.heatmap
)

# ClassifyConfig field holding each score's labelling threshold (headlens.classify.kinds.THRESHOLDS).
CONFIG_FIELDS = {column: th.field for column, th in kinds.THRESHOLD_OF.items()}


def score_thresholds(meta: dict | None = None) -> dict[str, float | None]:
    """Threshold per score column: the classifier's config in a classification's meta (`meta["config"]`),
    else the registry's defaults (headlens.classify.labels.cut_offs); `meta["thresholds"]` ({column: value})
    overrides all."""
    meta = meta or {}
    cuts = cut_offs(meta)
    found = {info.column: cuts.get(info.column) for info in SCORES}
    for column, value in (meta.get("thresholds") or {}).items():
        if column in found and isinstance(value, (int, float)):
            found[column] = float(value)
    return found


# The scores that back each label, the first one ranking heads within the kind (headlens.classify.kinds).
ROLE_EVIDENCE: dict[str, tuple[str, ...]] = {kind.label: kind.evidence for kind in kinds.KINDS}


def role_strength(row: dict, role: str) -> float:
    """The score ranking a head within `role` (-inf when the frame lacks it or it is NaN)."""
    return head_strength(row, role)
