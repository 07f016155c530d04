"""HTML of each report section, from the library's DataFrames. Every piece of text is escaped here.

Each function returns an HTML fragment (a `<section>`), readable without JavaScript: figures are
PNG data URIs and tables are plain tables (sortable when the page script runs). Every piece of
prose comes from the message catalogue (headlens.reports.i18n) in the report's language `lang`.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import PurePath

import numpy as np
import pandas as pd

from headlens.classify import kinds
from headlens.classify.labels import PROPERTIES, ROLES, label_list, rank_heads
from headlens.intervene.metrics import ALIASES, KIND, UNIT
from headlens.reports import explain, figures
from headlens.reports.facts import identical_note, validation_summary
from headlens.reports.i18n import (
    DEFAULT_LANG,
    column_heading,
    has,
    integer,
    percent,
    quantity,
    short_number,
    significant,
    t,
)
from headlens.results import Result


def esc(value) -> str:
    """Escape any value for HTML text and attribute context (quotes included)."""
    return html.escape(str(value), quote=True)


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}">\n<h2>{esc(title)}</h2>\n{body}\n</section>\n'


def figure(uri: str, alt: str, caption: str = "") -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{uri}" alt="{esc(alt)}">{cap}</figure>'


def zoomable(uri: str, alt: str) -> str:
    """A figure drawn small in a grid of small multiples that opens large on a click (a hidden checkbox, no
    script needed; Escape or a click outside closes it, report.js)."""
    return (
        f'<figure><label class="zoom"><input type="checkbox" class="zoom-toggle"><span class="heatmap">'
        f'<img src="{uri}" alt="{esc(alt)}"></span></label></figure>'
    )


# Columns whose cells are names from the code or the command line (a setting, a metric, a method, a
# validated quantity and its reference): shown as code, the same in every language.
IDENTIFIER_COLUMNS = {"setting", "method", "metric", "quantity", "reference"}


# Significant figures of a table's numbers: 3, or fewer where more would claim a precision the quantity
# has not (a p-value from 20 random sets; an error compared with its tolerance).
# Significant figures of a cell's sort key: ties only between values that agree to 8 figures.
SORT_DIGITS = 8
DIGITS, COLUMN_DIGITS = 3, {"p_value": 2, "smallest_p": 2, "max_abs_error": 2, "tolerance": 2}


def format_cell(value, lang: str = DEFAULT_LANG, digits: int = DIGITS) -> tuple[str, str]:
    """(shown text, sort key) of one table cell, numbers in `lang`'s convention, floats to `digits`
    significant figures (i18n.significant: one style for every table)."""
    if value is None:
        return t("cell.unset", lang), ""
    if isinstance(value, (list, tuple, np.ndarray)):
        text = "; ".join(format_cell(v, lang, digits)[0] for v in value)
        return text, text
    if isinstance(value, dict):  # a probe's facts: each value in the same style as a cell's
        text = "; ".join(f"{key} {format_cell(v, lang, digits)[0]}" for key, v in value.items())
        return text, text
    if isinstance(value, (bool, np.bool_)):
        return t("cell.yes" if value else "cell.no", lang), str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "", "-inf"
        return significant(float(value), lang, digits), f"{float(value):.{SORT_DIGITS}g}"
    if isinstance(value, (int, np.integer)):
        return integer(value, lang), str(int(value))
    return str(value), str(value)


def table(
    frame: pd.DataFrame, *, sortable: bool = True, row_class=None, lang: str = DEFAULT_LANG, table_id: str | None = None
) -> str:
    """A plain HTML table; `data-sort` holds a numeric key where the cell is a number. Headings come
    from the catalogue where it has the column ("col.<name>"), the column's name in `title`."""
    head = "".join(
        f'<th scope="col" data-column="{esc(column)}" title="{esc(column)}">{esc(column_heading(column, lang))}</th>'
        for column in frame.columns
    )
    rows = []
    code = [column in IDENTIFIER_COLUMNS for column in frame.columns]
    digits = [COLUMN_DIGITS.get(column, DIGITS) for column in frame.columns]
    for values in frame.itertuples(index=False, name=None):  # keeps each column's dtype (iterrows does not)
        cells = []
        for value, is_code, places in zip(values, code, digits, strict=True):
            text, key = format_cell(value, lang, places)
            shown = f"<code>{esc(text)}</code>" if is_code else esc(text)
            if isinstance(value, dict):  # a probe's facts: their names are identifiers, their values numbers
                shown = facts_html(value, lang, places)
            cells.append(f'<td data-sort="{esc(key)}">{shown}</td>')
        css = row_class(dict(zip(frame.columns, values, strict=True))) if row_class else ""
        rows.append(f"<tr{f' class={chr(34)}{esc(css)}{chr(34)}' if css else ''}>{''.join(cells)}</tr>")
    cls = (' class="sortable"' if sortable else "") + (f' id="{esc(table_id)}"' if table_id else "")
    return (
        f'<div class="table-wrap"><table{cls}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def facts_html(value, lang: str, places: int, nested: bool = False) -> str:
    """A probe's facts ({name: value}, a nested one in brackets) as a cell: each name as code, each value in the
    cells' style."""
    if not isinstance(value, dict):
        return esc(format_cell(value, lang, places)[0])
    inner = "; ".join(f"<code>{esc(key)}</code> {facts_html(item, lang, places, True)}" for key, item in value.items())
    return f"({inner})" if nested else inner


def details(summary: str, body: str) -> str:
    """A collapsed block (works without JavaScript)."""
    return f"<details><summary>{esc(summary)}</summary>{body}</details>"


def summary_section(
    model_info: dict,
    *,
    version: str,
    date: str,
    command: str | None,
    text_label: str | None,
    text_excerpt: str | None,
    lang: str = DEFAULT_LANG,
    repeated: bool = False,
    random_sample: bool = False,
) -> str:
    """Model, shape, parameter count, text used, version, date and the command that rebuilds the page;
    the sample text, and what the viewer shows of it (`repeated`: it twice; `random_sample`: random
    tokens repeated instead)."""
    info = model_info
    unknown = "?"
    params = info.get("n_params")
    missing = t("summary.not_recorded", lang)
    items = [
        (
            t("summary.model", lang),
            info.get("name", unknown)
            + (
                f" ({t('summary.dequantized', lang, quantization=info['quantization'])})"
                if info.get("quantization")
                else ""
            ),
        ),
        (t("summary.shape", lang), shape_text(info, lang)),
        (
            t("summary.context", lang),
            t("summary.context_value", lang, d_model=info.get("d_model", unknown), n_ctx=info.get("n_ctx", unknown)),
        ),
        (t("summary.parameters", lang), integer(params, lang) if isinstance(params, int) else (params or unknown)),
        (t("summary.text_used", lang), text_label or missing),
        (t("summary.version", lang), version),
        (t("summary.date", lang), date),
    ]
    rows = "".join(f'<tr><th scope="row">{esc(k)}</th><td>{esc(v)}</td></tr>' for k, v in items)
    body = f'<table class="summary">{rows}</table>'
    body += f'<p>{esc(t("summary.reproduce", lang))}</p><pre class="command">{esc(command or missing)}</pre>'
    if text_excerpt:
        key = "summary.sample_random" if random_sample else "summary.sample_repeated" if repeated else "summary.sample"
        heading = t(key, lang)
        sample = f'<pre class="sample-text">{esc(text_excerpt)}</pre>'
        body += f'<details class="sample"><summary>{esc(heading)}</summary>{sample}</details>'
    return section("summary", t("summary.title", lang), body)


def display_name(model_info: dict) -> str:
    """The model's name for a title: `display_name` when the loader gives one, else the last part of
    `name` (a folder or file path names the model by its last part; "smollm2" stays "smollm2")."""
    shown = model_info.get("display_name")
    if shown:
        return str(shown)
    name = str(model_info.get("name") or "model").rstrip("/\\")
    return PurePath(name).name or name


def shape_text(info: dict, lang: str) -> str:
    """ "12 layers x 12 heads x d_head 64", naming the key/value heads when fewer than the query heads (GQA)."""
    shape = {name: info.get(name, "?") for name in ("n_layers", "n_heads", "d_head")}
    n_kv = info.get("n_kv_heads")
    if isinstance(n_kv, int) and isinstance(shape["n_heads"], int) and n_kv < shape["n_heads"]:
        return t("summary.shape_value_gqa", lang, n_kv_heads=n_kv, **shape)
    return t("summary.shape_value", lang, **shape)


# Scores drawn without a cut-off of their own: the label they show rests on another score (the positional
# share at a fixed offset, headlens.classify.kinds), so their heatmap outlines the heads carrying the label.
RULE_ELSEWHERE = {"prev_token_score": "previous_token", "current_token_score": "current_token"}


def score_heatmaps(heads: Result, lang: str = DEFAULT_LANG):
    """(score info, heatmap data URI, threshold sentence) for each score present in the classification `heads`
    (explain.SCORES order, thresholds from its meta); the sentence is "" for scores without a labelling threshold."""
    thresholds = explain.score_thresholds(heads.meta)
    heads = heads.frame
    shown = [info for info in explain.SCORES if info.column in heads and not heads[info.column].isna().all()]
    jobs = [
        {
            "column": info.column,
            "vmin": info.vmin,
            "vmax": info.vmax,
            "threshold": thresholds.get(info.column),
            "label": RULE_ELSEWHERE.get(info.column),
        }
        for info in shown
    ]
    for info, job, uri in zip(shown, jobs, figures.score_heatmap_uris(heads, jobs, lang), strict=True):
        threshold = job["threshold"]
        cut = "" if threshold is None else " " + t("scores.threshold", lang, threshold=short_number(threshold, lang))
        if job["label"]:
            positional = thresholds.get("positional_share")
            cut = " " + t(f"scores.rule.{info.column}", lang, threshold=short_number(positional or 0.9, lang))
        yield info, uri, cut


# A model with more heads than this gets its score heatmaps and label table folded (<details>), so that the
# findings, the viewer and the evidence come within a few screens; a smaller model shows them open.
FOLD_HEADS = 48


def about(text: str, lang: str = DEFAULT_LANG, summary: str = "page.about") -> str:
    """A section's explanation of its method or its use (plain text), folded under the one line `summary` (a
    catalogue key; "How this was measured" by default)."""
    return details(t(summary, lang), f'<p class="explain">{esc(text)}</p>')


def fold(summary: str, body: str, folded: bool) -> str:
    """`body` in a closed <details> element when `folded`, else as it is."""
    return details(summary, body) if folded else body


def scores_section(heads: Result, lang: str = DEFAULT_LANG) -> str:
    """One heatmap per score with its explanation and threshold, then the label table (labelled heads
    first, with a "labelled only / all heads" switch the page script shows); both folded for a large model.
    `heads`: a classification (classify_heads' Result)."""
    folded = len(heads) > FOLD_HEADS
    maps = [score_cell(info, uri, cut, lang) for info, uri, cut in score_heatmaps(heads, lang)]
    grid = f'<div class="score-grid">{"".join(maps)}</div>' if maps else ""
    parts = [
        f"<p>{esc(t('scores.intro', lang))} {esc(t('scores.zoom', lang))}</p>",
        fold(t("scores.open_heatmaps", lang, n=len(maps)), grid, folded),
    ]
    frame = label_frame(heads.frame)
    n_roles = sum(row_kind(labels) == "labelled" for labels in frame["labels"])
    parts.append(f"<h3>{esc(t('scores.labels_title', lang))}</h3>")
    labels = (
        f"<p>{esc(t('scores.labels_intro', lang))}</p>"
        + label_switch(n_roles, len(frame), lang)
        + table(frame, lang=lang, table_id="label-table", row_class=lambda row: row_kind(row["labels"]))
    )
    parts.append(fold(t("scores.open_labels", lang, n=len(frame)), labels, folded))
    settings = {**(heads.meta.get("config") or {}), **(heads.meta.get("probes") or {})}
    # why a probe did not run is prose: the findings say it in the page's language
    settings = {key: value for key, value in settings.items() if not key.endswith("_missing")}
    if settings:
        frame = pd.DataFrame({"setting": list(settings), "value": pd.Series(list(settings.values()), dtype=object)})
        parts.append(details(t("scores.settings", lang), table(frame, sortable=False, lang=lang)))
    return section("scores", t("scores.title", lang), "\n".join(parts))


def score_cell(info, uri: str, cut: str, lang: str) -> str:
    """One small multiple: the score's name and its heatmap (opens large on a click), then the rule that labels
    by it and what it measures with its source, folded under a one-line summary."""
    rule = f'<p class="rule">{esc(cut.strip())}</p>' if cut else ""
    what = f'{rule}<p class="explain">{esc(info.what(lang))} <cite>{esc(info.source(lang))}</cite></p>'
    return (
        f'<div class="score" id="score-{esc(info.column)}"><h3>{esc(info.title(lang))}</h3>'
        f"{zoomable(uri, t('scores.heatmap_alt', lang, column=info.column))}"
        f"{details(t('scores.what', lang), what)}</div>"
    )


def label_switch(n_labelled: int, n_all: int, lang: str) -> str:
    """The "labelled only / all heads" radio pair; hidden until the page script wires it (without
    JavaScript the whole table shows)."""

    def option(value: str, text: str, checked: bool) -> str:
        return (
            f'<label><input type="radio" name="label-view" value="{value}"{" checked" if checked else ""}> '
            f"{esc(text)}</label>"
        )

    return (
        f'<fieldset id="label-switch" class="switch" hidden><legend>{esc(t("scores.switch_legend", lang))}'
        f"</legend>{option('labelled', t('scores.switch_labelled', lang, n=n_labelled), n_labelled > 0)} "
        f"{option('all', t('scores.switch_all', lang, n=n_all), n_labelled == 0)}</fieldset>"
    )


def label_frame(heads: pd.DataFrame, lang: str = DEFAULT_LANG) -> pd.DataFrame:
    """The label table: head, labels, then the table's score columns present (headlens.classify.kinds
    TABLE_COLUMNS, the CLI table's), in headlens.classify.labels.rank_heads order: heads with a role first,
    by role, strongest first; then heads with only a property (first-token sinks); then the rest."""
    frame = rank_heads(heads)
    labels = [label_list(v) for v in frame["labels"]] if "labels" in frame else [[] for _ in range(len(frame))]
    out = pd.DataFrame({"head": [f"{layer}.{head}" for layer, head in zip(frame["layer"], frame["head"], strict=True)]})
    out["labels"] = [", ".join(names) or t("cell.none", lang) for names in labels]
    for column in kinds.TABLE_COLUMNS:
        if column in frame:
            out[column] = frame[column].to_numpy()
    return out


def row_kind(labels: str) -> str:
    """CSS class of a label-table row: "labelled" (a role), "property" (only a property), "unlabelled"."""
    names = [name.strip() for name in labels.split(",")]
    if any(name in ROLES for name in names):
        return "labelled"
    return "property" if any(name in PROPERTIES for name in names) else "unlabelled"


def labelled_heads(heads: pd.DataFrame | None) -> list[tuple[int, int, list[str]]]:
    """(layer, head, labels) of every head with at least one label, in (layer, head) order."""
    if heads is None or "labels" not in heads:
        return []
    frame = heads.sort_values(["layer", "head"])
    return [(int(r.layer), int(r.head), label_list(r.labels)) for r in frame.itertuples() if label_list(r.labels)]


def results_list(ablation) -> list[dict]:
    """The metas of ablate_heads result(s): one Result, a list of them, or None."""
    results = [] if ablation is None else [ablation] if isinstance(ablation, Result) else list(ablation)
    return [result.meta for result in results]


def result_delta(result) -> float:
    """The change of a result's (or sweep row's) metric: `delta`; a loss-only result of an older
    release has `delta_loss`."""
    return float(result["delta"] if "delta" in result else result["delta_loss"])


def metric_words(metric: str, lang: str) -> tuple[str, str]:
    """The metric's name and unit in `lang` (the catalogue's `metric.*` and `unit.*`)."""
    name = t(f"metric.{metric}", lang) if has(f"metric.{metric}", lang) else str(metric)
    unit_key = f"unit.{'loss' if metric == 'text' else metric}"
    return name, t(unit_key, lang) if has(unit_key, lang) else ""


def delta_axis(metric: str, lang: str) -> str:
    """The axis label of a change of `metric`: "change in loss on the text (nats/token)"."""
    name, unit = metric_words(metric, lang)
    return t("fig.delta", lang, metric=name, unit=unit)


def metric_heading(metric: str, lang: str) -> str:
    """ "loss on repeated tokens, in nats/token": what a block's numbers are."""
    name, unit = metric_words(metric, lang)
    return t("ablation.metric_heading", lang, metric=name, unit=unit)


def sweep_block(sweep: Result, lang: str = DEFAULT_LANG, top_rows: int = 10, sortable: bool = True) -> str:
    """The sweep's heatmap of the change of its metric, then the heads the model needs most (the
    largest rise of a loss, the largest fall of the other metrics)."""
    metric, sweep = sweep.meta.get("metric", "text"), sweep.frame
    column = "delta" if "delta" in sweep else "delta_loss"
    a_loss = KIND.get(ALIASES.get(metric, metric), "loss") == "loss"
    top = sweep.sort_values(column, ascending=not a_loss).head(top_rows).reset_index(drop=True)
    heatmap = figures.delta_heatmap_uri(sweep, lang, column=column, label=delta_axis(metric, lang))
    return (
        f"<p>{esc(metric_heading(metric, lang))}</p>"
        + figure(heatmap, t("ablation.sweep_alt", lang))
        + f"<p>{esc(t('ablation.top', lang))}</p>"
        + table(top, sortable=sortable, lang=lang)
    )


def chosen_blocks(ablation, lang: str = DEFAULT_LANG, sortable: bool = True) -> str:
    """One chart and one table per metric of the ablate_heads results: charts never share an axis
    across metrics."""
    by_metric: dict[str, list[dict]] = {}
    for row in ablation_rows(ablation):
        by_metric.setdefault(row["metric"], []).append(row)
    parts = []
    for metric, rows in by_metric.items():
        shown = pd.DataFrame(
            [
                {
                    "heads": r["label"],
                    "method": r["method"],
                    "n": r["n"],
                    "delta": r["delta"],
                    "ci95_low": r["low"],
                    "ci95_high": r["high"],
                }
                for r in rows
            ]
        )
        parts.append(
            f"<p><strong>{esc(metric_heading(metric, lang))}</strong></p>"
            + figure(
                figures.ablation_bars_uri(rows, lang, label=delta_axis(metric, lang)),
                t("ablation.bars_alt", lang, axis=delta_axis(metric, lang)),
                t("ablation.bars_caption", lang),
            )
            + table(shown, sortable=sortable, lang=lang)
        )
    return "\n".join(parts)


def ablation_section(sweep: Result | None, ablation, pruning: Result | None, lang: str = DEFAULT_LANG) -> str:
    """Sweep heatmap, bars of the chosen heads with CIs (one chart per metric), pruning curve:
    whichever were computed."""
    parts = [about(t("ablation.text", lang), lang)]
    if sweep is not None:
        parts.append(f"<h3>{esc(t('ablation.sweep_title', lang))}</h3>" + sweep_block(sweep, lang))
    results = results_list(ablation)
    if results:
        charts = chosen_blocks(ablation, lang)
        if all(result.get("control") for result in results):  # the table of controls below gives their numbers
            charts = details(t("ablation.open_charts", lang, n=len(results)), charts)
        parts.append(f"<h3>{esc(t('ablation.chosen_title', lang))}</h3>" + charts)
    parts.append(control_block(ablation, lang))
    if pruning is not None:
        parts.append(
            f"<h3>{esc(t('ablation.pruning_title', lang))}</h3>"
            + figure(figures.pruning_curve_uri(pruning.frame, lang), t("ablation.pruning_alt", lang))
            + pruning_summary(pruning, lang)
        )
        full = table(pruning.frame.reset_index(drop=True), lang=lang)
        parts.append(details(t("ablation.pruning_table", lang), full))
    only_pruning = sweep is None and not ablation_rows(ablation)
    return section("ablation", t("pruning.title" if only_pruning else "ablation.title", lang), "\n".join(parts))


def pruning_summary(pruning: Result, lang: str = DEFAULT_LANG) -> str:
    """What the CLI prints under the curve, from its meta: heads that can go within the tolerance, and
    whether labelled heads are removed later (the role-order permutation test); "" when not recorded."""
    facts, lines = pruning.meta, []
    if "heads_within" in facts:
        lines.append(
            t(
                "pruning.within",
                lang,
                n_ok=facts["heads_within"],
                n_total=facts.get("n_heads", "?"),
                tolerance=percent(facts.get("tolerance", 0.05), lang),
                loss=quantity(float(pruning.frame["loss"].iloc[0]), lang),
            )
        )
    order = facts.get("removal_by_role")
    if order:
        if order.get("p_value") is None:
            lines.append(
                t("pruning.order_none", lang, n_labelled=order["n_labelled"], n_unlabelled=order["n_unlabelled"])
            )
        else:
            lines.append(
                t(
                    "pruning.order",
                    lang,
                    n_labelled=order["n_labelled"],
                    n_unlabelled=order["n_unlabelled"],
                    labelled=short_number(order["mean_rank_labelled"], lang, ".2f"),
                    unlabelled=short_number(order["mean_rank_unlabelled"], lang, ".2f"),
                    p=quantity(order["p_value"], lang),
                )
            )
    return "".join(f"<p>{esc(line)}</p>" for line in lines)


def ablation_rows(ablation) -> list[dict]:
    """ablate_heads result(s) -> bar rows (label, delta, low, high, method, metric, unit, n); one
    Result or a list of them. A result without a metric is a loss on the text."""
    rows = []
    for result in results_list(ablation):
        low, high = (result.get("ci95") or [float("nan"), float("nan")])[:2]
        metric = result.get("metric", "text")
        rows.append(
            {
                "label": bar_label(result),
                "delta": result_delta(result),
                "low": float(low),
                "high": float(high),
                "method": result.get("method", "?"),
                "metric": metric,
                "unit": result.get("unit") or UNIT.get(ALIASES.get(metric, metric), ""),
                "n": result.get("n", result.get("n_tokens", "?")),
            }
        )
    return rows


# A bar's label names its heads up to this many; a larger set is named by its role, or its first heads.
BAR_LABEL_HEADS = 4


def bar_label(result: dict) -> str:
    """An ablation bar's label: "1.0,1.2"; a larger set "induction (24)" by its role, else "0.1,0.3,... (24)"."""
    heads = [str(h) for h in result["heads"]]
    if len(heads) <= BAR_LABEL_HEADS:
        return ",".join(heads)
    name = result.get("role") or ",".join(heads[:2]) + ",\u2026"
    return f"{name} ({len(heads)})"


def control_block(ablation, lang: str = DEFAULT_LANG) -> str:
    """Heads chosen by role against random head sets of the same per-layer counts (Wu et al. 2024's
    control): one row per ablate_heads result that carries a `control`; empty without any."""
    rows = []
    for result in results_list(ablation):
        control = result.get("control")
        if not control:
            continue
        deltas = sorted(control["deltas"])
        rows.append(
            {
                "heads": chosen_by_text(result, lang),
                "metric": result["metric"],
                "delta": result["delta"],
                "rank": t("ablation.rank", lang, rank=control["rank"], n=control["k"] + 1),
                "p_value": control["p_value"],
                "smallest_p": control.get("p_min", 1 / (1 + control["k"])),
                "random_median": deltas[len(deltas) // 2],
                "random_min": deltas[0],
                "random_max": deltas[-1],
                "random_sets": control["k"],
                "possible_sets": control.get("n_possible", control["k"]),
                "exact": bool(control.get("exact")),
                "method": result["method"],
                "chosen": ",".join(map(str, result["heads"])),  # last: a long list wraps, the key columns stay in view
            }
        )
    if not rows:
        return ""
    return f"<h3>{esc(t('ablation.control_title', lang))}</h3>{about(t('ablation.control_text', lang), lang)}" + table(
        pd.DataFrame(rows), lang=lang, table_id="control-table"
    )


# ablate_heads's `chosen_by` for a role ("heads labelled induction by the labels given"), read back into
# the catalogue's words; any other text is shown as it is.
CHOSEN_BY = re.compile(r"heads labelled (?P<role>\S+) by (?P<source>the labels given|classifying the model.*)")


def chosen_by_text(result: dict, lang: str = DEFAULT_LANG) -> str:
    """How a result's heads were chosen, in `lang`; the head list when they were given by hand."""
    chosen_by = result.get("chosen_by")
    if not chosen_by:
        return ",".join(map(str, result["heads"]))
    found = CHOSEN_BY.fullmatch(chosen_by)
    if not found:
        return chosen_by
    source = "ablation.source_given" if found["source"] == "the labels given" else "ablation.source_classified"
    return t("ablation.chosen_role", lang, role=found["role"], source=t(source, lang))


def validation_section(validation: Result, lang: str = DEFAULT_LANG) -> str:
    """The MHA validation table (validate_model's Result), failures highlighted."""
    meta, validation = validation.meta, validation.frame
    failed = int((~validation["passed"].astype(bool)).sum()) if "passed" in validation else 0
    verdict = t("validation.passed", lang) if failed == 0 else t("validation.failed", lang, n=failed)
    source = meta.get("text_source")
    if source:
        verdict = t(
            "validation.text_source",
            lang,
            verdict=verdict,
            source=source,
            n_tokens=meta.get("n_tokens", "?"),
        )
    failed_row = lambda row: "" if bool(row.get("passed", True)) else "failed"  # noqa: E731
    body = f"<p><strong>{esc(verdict)}</strong>.</p>" + about(
        f"{t('validation.text', lang)} {identical_note(validation, lang)}", lang
    )
    summary = validation_summary(validation)
    if summary is not None:
        n_layers = validation["layer"].nunique()
        body += f"<p>{esc(t('validation.summary', lang, n_layers=n_layers))}</p>"
        body += table(summary, lang=lang, row_class=failed_row)
    full = table(validation.reset_index(drop=True), lang=lang, row_class=failed_row)
    body += details(t("validation.all_rows", lang, n=len(validation)), full) if summary is not None else full
    return section("validation", t("validation.title", lang), body)


def training_figure(training, lang: str = DEFAULT_LANG) -> str:
    """What the training curves show (the phase change, or its absence, by the rule) and the figure:
    the body of the page's training section and of the inline view. `training`: load_training_log's Result."""
    log, heads = training.frame, training.tables["heads"]
    change = figures.phase_change_step(log)
    rule = t(
        "training.rule",
        lang,
        low=short_number(figures.PHASE_LOW, lang),
        high=short_number(figures.PHASE_HIGH, lang),
        share=percent(figures.PHASE_WINDOW_SHARE, lang),
    )
    note = (
        t("training.change", lang, step=change, rule=rule)
        if change is not None
        else t("training.no_change", lang, rule=rule)
    )
    icl = log["icl_score"].dropna() if "icl_score" in log else ()
    if len(icl):  # the sign the plot shows, said in words beside "more negative is better"
        last = float(icl.iloc[-1])
        note += " " + t(
            "training.icl_last",
            lang,
            value=("+" if last >= 0 else "") + quantity(last, lang),
            verdict=t("training.icl_gain" if last < 0 else "training.icl_no_gain", lang),
        )
    return f'<p class="explain">{esc(t("training.text", lang))} {esc(note)}</p>' + figure(
        figures.training_uri(log, heads, lang), t("training.alt", lang)
    )


def training_section(training, lang: str = DEFAULT_LANG) -> str:
    """Loss and score curves of the embedded model's training run, the phase change marked."""
    log = training.frame
    body = training_figure(training, lang) + details(
        t("training.log", lang, n=len(log)), table(log.reset_index(drop=True), lang=lang)
    )
    return section("training", t("training.title", lang), body)
