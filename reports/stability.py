"""The report's "How stable are these labels" section: the borderline labels of a classification, each with
its score, 95% bootstrap interval, cut-off and stability (headlens.classify.stability), and per role a small
plot of the number of heads labelled against the cut-off, the chosen cut-off marked (titled with its origin,
headlens.classify.kinds.ORIGINS), the heads' scores beneath it. The table and the plots are folded, the
table under a line that counts the borderline labels and names their heads."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headlens.classify import kinds
from headlens.classify.labels import ClassifyConfig, label_list
from headlens.reports.figures import figure_uri
from headlens.reports.i18n import DEFAULT_LANG, percent, t
from headlens.reports.sections import about, details, esc, figure, section, table

STEPS = 101  # cut-offs drawn across each score's range
PANELS_PER_ROW = 4
NAMED_HEADS = 10  # heads named in the folded table's summary line at most


def stability_section(heads, lang: str = DEFAULT_LANG) -> str:
    """The section's HTML; "" for a classification without labels."""
    frame, meta = heads.frame, heads.meta
    if "labels" not in frame:
        return ""
    facts = (meta.get("probes") or {}).get("stability")
    if not facts:
        return section("stability", t("stability.title", lang), f"<p>{esc(t('stability.not_run', lang))}</p>")
    pct = percent(facts["stable_min"], lang)
    parts = [about(t("stability.intro", lang, resamples=facts["resamples"], stable_pct=pct), lang)]
    weak = borderline_rows(frame, meta)
    if weak.empty:
        parts.append(f"<p>{esc(t('stability.none', lang, stable_pct=pct))}</p>")
    else:  # folded under a one-line summary: the count and the labels' heads, the numbers a click away
        named = list(dict.fromkeys(weak["head"]))
        heads = ", ".join(named[:NAMED_HEADS]) + (", …" if len(named) > NAMED_HEADS else "")
        summary = t("stability.table_open", lang, n=len(weak), stable_pct=pct, heads=heads)
        parts.append(details(summary, f"<p>{esc(t('stability.table_intro', lang))}</p>" + table(weak, lang=lang)))
    uri = cut_off_plot(frame, _config(meta), lang)
    if uri:
        body = f"<p>{esc(t('stability.cutoffs_intro', lang))}</p>" + figure(uri, t("stability.plot_alt", lang))
        parts.append(details(t("stability.cutoffs_title", lang), body))
    return section("stability", t("stability.title", lang), "\n".join(parts))


def _config(meta: dict) -> ClassifyConfig:
    """The ClassifyConfig the labels were given under (meta["config"]), defaults where it lacks a field."""
    given = meta.get("config") or {}
    names = {f.name for f in fields(ClassifyConfig)}
    return replace(ClassifyConfig(), **{k: v for k, v in given.items() if k in names})


def borderline_rows(frame: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """One row per borderline label: head, label, its ranking score with the 95% interval, cut-off, stability."""
    config, rows = _config(meta), []
    for row in frame.to_dict("records"):
        for label in label_list(row.get("borderline")):
            column = kinds.BY_LABEL[label].score
            th = kinds.THRESHOLD_OF.get(column)
            rows.append(
                {
                    "head": f"{row['layer']}.{row['head']}",
                    "label": label,
                    "score": column,
                    "value": row[column],
                    "low": row.get(f"{column}_lo", math.nan),
                    "high": row.get(f"{column}_hi", math.nan),
                    "cut_off": getattr(config, th.field) if th else math.nan,
                    "stability": row[f"{label}_stability"],
                }
            )
    return pd.DataFrame(rows)


def labelled_counts(frame: pd.DataFrame, label: str, config: ClassifyConfig, cuts: np.ndarray) -> np.ndarray:
    """Heads `label`'s rule labels at each cut-off of its ranking score (the rule's other cut-offs held)."""
    th = kinds.THRESHOLD_OF[kinds.BY_LABEL[label].score]
    scores = {s.column: frame[s.column].to_numpy(dtype=float) for s in kinds.SCORES if s.column in frame}
    rule = kinds.BY_LABEL[label].rule
    return np.array([int(np.sum(rule(scores, replace(config, **{th.field: float(cut)})))) for cut in cuts])


def cut_off_plot(frame: pd.DataFrame, config: ClassifyConfig, lang: str) -> str | None:
    """Small multiples, one per role (and property) some head carries whose ranking score has a cut-off."""
    carried = {label for value in frame["labels"] for label in label_list(value)}
    labels = [k.label for k in kinds.KINDS if k.label in carried and k.score in kinds.THRESHOLD_OF and k.score in frame]
    if not labels:
        return None
    n_rows = math.ceil(len(labels) / PANELS_PER_ROW)
    fig = Figure(figsize=(2.6 * min(len(labels), PANELS_PER_ROW), 2.2 * n_rows))
    for index, label in enumerate(labels):
        _panel(fig.add_subplot(n_rows, min(len(labels), PANELS_PER_ROW), index + 1), frame, label, config, lang)
    fig.tight_layout()
    return figure_uri(fig)


def _panel(ax, frame: pd.DataFrame, label: str, config: ClassifyConfig, lang: str) -> None:
    column = kinds.BY_LABEL[label].score
    th = kinds.THRESHOLD_OF[column]
    score = kinds.BY_COLUMN[column]
    cuts = np.linspace(score.vmin if score.vmin >= 0 else 0.0, score.vmax, STEPS)
    ax.plot(cuts, labelled_counts(frame, label, config, cuts), color="#1f77b4")
    chosen = getattr(config, th.field)
    ax.axvline(chosen, color="#d62728", linestyle="--", linewidth=1)
    values = frame[column].to_numpy(dtype=float)
    values = values[~np.isnan(values)]
    ax.plot(values, np.full(len(values), -0.04), "|", color="#444444", markersize=6, transform=ax.get_xaxis_transform())
    ax.set_title(f"{label} ({t(f'stability.origin.{th.origin}', lang)})", fontsize=8)
    ax.set_xlabel(f"{column} {t('stability.axis_cut', lang)}", fontsize=7)
    ax.set_ylabel(t("stability.axis_heads", lang), fontsize=7)
    ax.tick_params(labelsize=6)
