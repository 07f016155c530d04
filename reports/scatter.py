"""A role's two deciding scores as a scatter plot: every head one dot (its x the first cut score, its y the
second), the cut-offs drawn as dashed lines, the heads carrying the role in the role's colour
(headlens.reports.colours) and named. Drawn for each role whose label rule cuts two scores (induction:
prefix matching and copying; copy suppression; name movers), as inline SVG: text in the page's font, a few
kilobytes for hundreds of heads."""

from __future__ import annotations

import math

import pandas as pd

from headlens.classify import kinds
from headlens.classify.labels import label_list
from headlens.reports import explain
from headlens.reports.colours import role_colour
from headlens.reports.i18n import DEFAULT_LANG, short_number, t
from headlens.reports.sections import esc

SIZE, MARGIN = 190, 40  # plot square and the room for the axes' numbers and names, in CSS pixels
NAMED_HEADS = 12  # role heads named beside their dots at most (the strongest by the first score)
OTHERS = "#9a9a9a"


def scatter_columns(role: str) -> tuple[str, str] | None:
    """The two scores the role's label rule cuts, in the registry's order; None for a rule of one score."""
    columns = list(dict.fromkeys(th.column for th in kinds.BY_LABEL[role].thresholds))
    return (columns[0], columns[1]) if len(columns) == 2 else None


def _span(values: list[float], cut: float | None) -> tuple[float, float]:
    """The axis range: every value, the cut-off, and at least 0..1 (the scores' usual range)."""
    points = [*values, 0.0, 1.0] + ([cut] if cut is not None else [])
    return min(points), max(points)


def role_scatter(heads: pd.DataFrame, role: str, meta: dict | None, lang: str = DEFAULT_LANG) -> str:
    """The role's scatter plot as an `<svg>` in a figure, or "" when the rule cuts fewer than two scores or the
    frame lacks them."""
    columns = scatter_columns(role)
    if columns is None or not all(column in heads for column in columns):
        return ""
    xs, ys = (heads[column].astype(float) for column in columns)
    keep = [math.isfinite(x) and math.isfinite(y) for x, y in zip(xs, ys, strict=True)]
    frame = heads[keep]
    if frame.empty:
        return ""
    cuts = explain.score_thresholds(meta)
    spans = [_span(list(frame[c].astype(float)), cuts.get(c)) for c in columns]

    def at(value: float, axis: int) -> float:
        low, high = spans[axis]
        share = (value - low) / (high - low or 1.0)
        return MARGIN + share * SIZE if axis == 0 else 10 + (1 - share) * SIZE

    parts = _axes(columns, spans, cuts, at, lang)
    mine = [label_list(labels) for labels in frame["labels"]] if "labels" in frame else [[]] * len(frame)
    colour = role_colour(role)
    ranked = []
    for row, names in sorted(zip(frame.to_dict("records"), mine, strict=True), key=lambda p: role in p[1]):
        x, y = at(float(row[columns[0]]), 0), at(float(row[columns[1]]), 1)
        head = f"{int(row['layer'])}.{int(row['head'])}"
        fill = colour if role in names else OTHERS
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{fill}" data-head="{head}"><title>{head}</title></circle>'
        )
        if role in names:
            ranked.append((-float(row[columns[0]]), head, x, y))
    parts += [
        f'<text x="{x + 4:.1f}" y="{y - 4:.1f}" class="name">{h}</text>' for _, h, x, y in sorted(ranked)[:NAMED_HEADS]
    ]
    name = t(kinds.BY_LABEL[role].name_key, lang)
    width, height = MARGIN + SIZE + 10, 10 + SIZE + MARGIN
    alt = t("scatter.alt", lang, role=name, x=t(f"short.{columns[0]}", lang), y=t(f"short.{columns[1]}", lang))
    return (
        f'<figure class="scatter" data-role="{role}"><svg role="img" aria-label="{esc(alt)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'
        f"<figcaption>{esc(t('scatter.caption', lang, role=name))}</figcaption></figure>"
    )


def _axes(columns, spans, cuts, at, lang: str) -> list[str]:
    """The frame, each axis's ends and cut-off (dashed) with its value, and each axis's name."""
    bottom, right = 10 + SIZE, MARGIN + SIZE
    parts = [f'<rect x="{MARGIN}" y="10" width="{SIZE}" height="{SIZE}" class="frame"/>']
    for axis, column in enumerate(columns):
        low, high = spans[axis]
        cut = cuts.get(column)
        for value, kind in [(low, "end"), (high, "end")] + ([(cut, "cut")] if cut is not None else []):
            pos = at(value, axis)
            text = esc(short_number(value, lang, ".2g"))
            if axis == 0:
                if kind == "cut":
                    parts.append(f'<line x1="{pos:.1f}" y1="10" x2="{pos:.1f}" y2="{bottom}" class="cut"/>')
                parts.append(f'<text x="{pos:.1f}" y="{bottom + 13}" class="tick">{text}</text>')
            else:
                if kind == "cut":
                    parts.append(f'<line x1="{MARGIN}" y1="{pos:.1f}" x2="{right}" y2="{pos:.1f}" class="cut"/>')
                parts.append(f'<text x="{MARGIN - 3}" y="{pos + 4:.1f}" class="tick end">{text}</text>')
    parts.append(
        f'<text x="{MARGIN + SIZE / 2}" y="{bottom + 30}" class="axis">{esc(t(f"short.{columns[0]}", lang))}</text>'
    )
    middle = 10 + SIZE / 2
    parts.append(
        f'<text x="10" y="{middle}" class="axis" transform="rotate(-90 10 {middle})">'
        f"{esc(t(f'short.{columns[1]}', lang))}</text>"
    )
    return parts
