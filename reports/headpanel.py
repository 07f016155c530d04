"""What the head map shows when a reader points at or clicks a head: each head's roles, the scores that earned
them beside their cut-offs, its direct effects and the circuit edges it takes part in, written as text in the
page's language (numbers by headlens.reports.i18n) and embedded once as a JSON block (`#head-facts`). The page
script (report.js) puts a clicked head's facts in the panel under the map, with its pattern thumbnail when the
page has one; the cell's tooltip shows its first TOOLTIP_SCORES scores. Where the classification measured how
stable its labels are (headlens.classify.stability), each label's line gives the share of resamples that kept it
and its ranking score's 95% interval, a borderline label marked."""

from __future__ import annotations

import math

import pandas as pd

from headlens.classify import kinds
from headlens.classify.labels import label_list
from headlens.reports import explain
from headlens.reports.i18n import DEFAULT_LANG, percent, quantity, short_number, t

TOOLTIP_SCORES = 3  # deciding scores a cell's tooltip shows
PANEL_EDGES = 8  # circuit edges a head's panel lists at most (strongest first)


def _value(row: dict, column: str) -> float | None:
    value = row.get(column)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def score_pieces(row: dict, thresholds: dict, lang: str) -> list[str]:
    """ "prefix matching 0.812 (cut-off 0.4)" for each evidence score of the head's roles (registry order)."""
    roles = [name for name in label_list(row.get("labels")) if name in kinds.BY_LABEL]
    columns = dict.fromkeys(column for role in roles for column in kinds.BY_LABEL[role].evidence)
    pieces = []
    for column in columns:
        value = _value(row, column)
        if value is None:
            continue
        shown = str(int(value)) if column == "positional_offset" else quantity(value, lang)
        text = f"{t(f'short.{column}', lang)} {shown}"
        cut = thresholds.get(column)
        if cut is not None:
            text = t("findings.cut_off", lang, score=text, cut=short_number(cut, lang))
        pieces.append(text)
    return pieces


def circuit_lines(head: str, circuits: list[dict] | None, lang: str) -> tuple[list[str], list[str]]:
    """(direct effects per circuit task, the strongest edges into or out of `head`) as text."""
    direct, edges = [], []
    for doc in circuits or []:
        task = t(f"circuits.task.{doc['task']['name']}", lang)
        for row in doc.get("heads", []):
            if row["head"] == head and row.get("direct_effect") is not None:
                direct.append(t("panel.direct", lang, task=task, value=quantity(row["direct_effect"], lang)))
        mine = [e for e in doc.get("edges", []) if head in (e["sender"], e["receiver"]) and e["via"] != "direct"]
        mine.sort(key=lambda e: -abs(e.get("effect") or e.get("composition") or 0.0))
        for edge in mine:
            measured = edge.get("effect") if edge.get("effect") is not None else edge.get("composition")
            value = "-" if measured is None else quantity(measured, lang)
            ends = {"sender": edge["sender"], "receiver": edge["receiver"], "via": edge["via"]}
            edges.append(t("panel.edge", lang, **ends, value=value))
    return direct, edges[:PANEL_EDGES]


def stability_lines(row: dict, lang: str) -> list[list]:
    """[text, borderline] per label of the head with a `<label>_stability` column: "induction: kept in 87% of
    resamples; prefix matching 0.52 (95% interval 0.41 to 0.63)", borderline True below the stable share."""
    weak = set(label_list(row.get("borderline")))
    lines = []
    for label in label_list(row.get("labels")):
        share = _value(row, f"{label}_stability")
        if label not in kinds.BY_LABEL or share is None:
            continue
        column = kinds.BY_LABEL[label].score
        text = t("panel.stability", lang, label=t(kinds.BY_LABEL[label].name_key, lang), share=percent(share, lang))
        value, low, high = (_value(row, f"{column}{end}") for end in ("", "_lo", "_hi"))
        if None not in (value, low, high):
            interval = t("panel.interval", lang, low=quantity(low, lang), high=quantity(high, lang))
            text += f"; {t(f'short.{column}', lang)} {quantity(value, lang)} ({interval})"
        if label in weak:
            text += f" \u2014 {t('panel.borderline', lang)}"
        lines.append([text, label in weak])
    return lines


def head_facts(heads: pd.DataFrame, meta: dict | None, circuits: list[dict] | None, lang: str = DEFAULT_LANG) -> dict:
    """{"L.H": {"roles": [...], "scores": [...], "direct": [...], "edges": [...], "stability": [[text, borderline]]}}
    for every head of the frame, every entry text in `lang`."""
    thresholds = explain.score_thresholds(meta)
    facts = {}
    for row in heads.to_dict("records"):
        head = f"{int(row['layer'])}.{int(row['head'])}"
        names = label_list(row.get("labels"))
        direct, edges = circuit_lines(head, circuits, lang)
        ioi = _value(row, "ioi_direct_effect")
        if ioi is not None:
            direct.insert(0, f"{t('short.ioi_direct_effect', lang)} {quantity(ioi, lang)}")
        facts[head] = {
            "roles": [t(kinds.BY_LABEL[name].name_key, lang) for name in names if name in kinds.BY_LABEL],
            "scores": score_pieces(row, thresholds, lang),
            "direct": direct,
            "edges": edges,
            "stability": stability_lines(row, lang),
        }
    return facts
