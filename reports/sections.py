"""HTML of each report section, from the library's DataFrames. Every piece of text is escaped here.

Each function returns an HTML fragment (a `<section>`), readable without JavaScript: figures are
PNG data URIs and tables are plain tables (sortable when the page script runs).
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
from headlens.reports import explain, figures

# Thumbnails show at most this many tokens of the sample (the viewer shows them all), drawn about
# THUMB_PIXELS wide (an integer number of pixels per token).
THUMB_MAX_TOKENS = 128
THUMB_PIXELS = 256


def esc(value) -> str:
    """Escape any value for HTML text and attribute context (quotes included)."""
    return html.escape(str(value), quote=True)


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}">\n<h2>{esc(title)}</h2>\n{body}\n</section>\n'


def figure(uri: str, alt: str, caption: str = "") -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{uri}" alt="{esc(alt)}">{cap}</figure>'


def format_cell(value) -> tuple[str, str]:
    """(shown text, sort key) of one table cell."""
    if isinstance(value, (list, tuple, np.ndarray)):
        text = ", ".join(str(v) for v in value)
        return text, text
    if isinstance(value, (bool, np.bool_)):
        return ("yes" if value else "NO"), str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "", "-inf"
        return (f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"), repr(float(value))
    if isinstance(value, (int, np.integer)):
        return str(value), str(int(value))
    return str(value), str(value)


def table(frame: pd.DataFrame, *, sortable: bool = True, row_class=None) -> str:
    """A plain HTML table; `data-sort` holds a numeric key where the cell is a number."""
    head = "".join(f'<th scope="col">{esc(column)}</th>' for column in frame.columns)
    rows = []
    for values in frame.itertuples(index=False, name=None):  # keeps each column's dtype (iterrows does not)
        cells = []
        for value in values:
            text, key = format_cell(value)
            cells.append(f'<td data-sort="{esc(key)}">{esc(text)}</td>')
        css = row_class(dict(zip(frame.columns, values, strict=True))) if row_class else ""
        rows.append(f"<tr{f' class={chr(34)}{esc(css)}{chr(34)}' if css else ''}>{''.join(cells)}</tr>")
    cls = ' class="sortable"' if sortable else ""
    return (f'<div class="table-wrap"><table{cls}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def details(summary: str, body: str) -> str:
    """A collapsed block (works without JavaScript)."""
    return f"<details><summary>{esc(summary)}</summary>{body}</details>"


def summary_section(model_info: dict, *, version: str, date: str, command: str | None,
                    text_label: str | None, text_excerpt: str | None) -> str:
    """Model, shape, parameter count, text used, version, date and the command that rebuilds the page."""
    info = model_info
    shape = f"{info.get('n_layers', '?')} layers x {info.get('n_heads', '?')} heads x d_head {info.get('d_head', '?')}"
    params = info.get("n_params")
    items = [
        ("model", info.get("name", "?")),
        ("shape", shape),
        ("d_model / context", f"{info.get('d_model', '?')} / {info.get('n_ctx', '?')} tokens"),
        ("parameters", f"{params:,}" if isinstance(params, int) else (params or "?")),
        ("text used", text_label or "not recorded"),
        ("headlens version", version),
        ("date", date),
    ]
    rows = "".join(f"<tr><th scope=\"row\">{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in items)
    body = f'<table class="summary">{rows}</table>'
    body += f"<p>Reproduce this page with:</p><pre class=\"command\">{esc(command or 'not recorded')}</pre>"
    if text_excerpt:
        body += f"<p>Sample text (as read, start):</p><pre class=\"sample-text\">{esc(text_excerpt)}</pre>"
    return section("summary", "Summary", body)


def scores_section(heads: pd.DataFrame) -> str:
    """One heatmap per score with its explanation and threshold, then the label table."""
    thresholds = explain.score_thresholds(heads.attrs)
    parts = ['<p>Each heatmap is layer (rows) x head (columns), on a fixed colour scale per score. '
             'Cells at or above the labelling threshold are outlined.</p>']
    for info in explain.SCORES:
        if info.column not in heads or heads[info.column].isna().all():
            continue
        threshold = thresholds.get(info.column)
        uri = figures.score_heatmap_uri(heads, info.column, vmin=info.vmin, vmax=info.vmax, threshold=threshold)
        cut = f" Threshold: {threshold:g}." if threshold is not None else ""
        parts.append(
            f'<div class="score" id="score-{esc(info.column)}"><h3>{esc(info.title)}</h3>'
            f'{figure(uri, f"heatmap of {info.column}")}'
            f'<p class="explain">{esc(info.what)}{esc(cut)} <cite>{esc(info.source)}</cite></p></div>')
    parts.append("<h3>Labels</h3><p>Click a column heading to sort (needs JavaScript).</p>")
    parts.append(table(label_frame(heads)))
    settings = {**(heads.attrs.get("config") or {}), **(heads.attrs.get("probes") or {})}
    if settings:
        frame = pd.DataFrame({"setting": list(settings), "value": [str(v) for v in settings.values()]})
        parts.append(details("classifier settings and probes run", table(frame, sortable=False)))
    return section("scores", "Head scores and labels", "\n".join(parts))


def label_frame(heads: pd.DataFrame) -> pd.DataFrame:
    """The label table: head, labels, then every score column present (evidence columns left out)."""
    frame = heads.sort_values(["layer", "head"]).reset_index(drop=True)
    out = pd.DataFrame({"head": [f"{layer}.{head}" for layer, head in zip(frame["layer"], frame["head"], strict=True)]})
    out["labels"] = frame["labels"].map(lambda v: ", ".join(label_list(v)) or "-") if "labels" in frame else "-"
    extra = ["positional_offset"] + [info.column for info in explain.SCORES]
    for column in extra:
        if column in frame:
            out[column] = frame[column].to_numpy()
    return out


def labelled_heads(heads: pd.DataFrame | None) -> list[tuple[int, int, list[str]]]:
    """(layer, head, labels) of every head with at least one label, in (layer, head) order."""
    if heads is None or "labels" not in heads:
        return []
    frame = heads.sort_values(["layer", "head"])
    return [(int(r.layer), int(r.head), label_list(r.labels)) for r in frame.itertuples() if label_list(r.labels)]


def label_list(value) -> list[str]:
    """Labels as a list: classify_heads gives a list; a frame read back from CSV/JSON may hold "a,b" or NaN."""
    if isinstance(value, str):
        return [part.strip() for part in value.strip("[]").replace("'", "").split(",") if part.strip()]
    if isinstance(value, (list, tuple, np.ndarray)):
        return [str(v) for v in value]
    return []


def thumbnails_section(heads: pd.DataFrame | None, viewer: dict) -> str:
    """Pattern thumbnails of every labelled head on the sample's first tokens."""
    patterns = np.asarray(viewer["patterns"], dtype=np.float32)  # [layer, head, pos, pos]
    n = min(patterns.shape[-1], THUMB_MAX_TOKENS)
    chosen = labelled_heads(heads)
    if not chosen:
        body = "<p>No head carries a label, so there are no thumbnails; the viewer below shows every head.</p>"
        return section("thumbnails", "Attention patterns of labelled heads", body)
    cells = []
    for layer, head, labels in chosen:
        uri = figures.thumbnail_uri(patterns[layer, head, :n, :n], scale=max(1, THUMB_PIXELS // n))  # [q_pos, k_pos]
        cells.append(figure(uri, f"pattern of head {layer}.{head}", f"{layer}.{head}: {', '.join(labels)}"))
    words = "".join(f"<span>{esc(t)}</span>" for t in viewer["tokens"][:n])
    body = (f"<p>Rows: query token, columns: key token (first {n} tokens of the sample; bright = strong "
            f"attention, lower triangle only: the model is causal).</p><p class=\"thumb-tokens\">{words}</p>"
            f'<div class="thumbs">{"".join(cells)}</div>')
    return section("thumbnails", "Attention patterns of labelled heads", body)


def ablation_section(sweep: pd.DataFrame | None, ablation, pruning: pd.DataFrame | None) -> str:
    """Sweep heatmap, bars of the chosen heads with CIs, pruning curve: whichever were computed."""
    parts = [f'<p class="explain">{esc(explain.ABLATION_TEXT)}</p>']
    if sweep is not None:
        parts.append("<h3>Every head alone</h3>" + figure(figures.delta_heatmap_uri(sweep), "delta loss heatmap"))
        top = sweep.sort_values("delta_loss", ascending=False).head(10)
        parts.append("<p>The ten heads the model needs most:</p>" + table(top.reset_index(drop=True)))
    rows = ablation_rows(ablation)
    if rows:
        parts.append("<h3>Chosen heads</h3>" + figure(figures.ablation_bars_uri(rows), "delta loss bars",
                                                     "error bars: 95% confidence interval"))
        parts.append(table(pd.DataFrame(rows).rename(columns={"label": "heads", "delta": "delta_loss",
                                                              "low": "ci95_low", "high": "ci95_high"})))
    parts.append(control_block(ablation))
    if pruning is not None:
        parts.append("<h3>Pruning curve</h3>" + figure(figures.pruning_curve_uri(pruning), "pruning curve"))
        parts.append(details("pruning steps (table)", table(pruning.reset_index(drop=True))))
    return section("ablation", "Ablation", "\n".join(parts))


def ablation_rows(ablation) -> list[dict]:
    """ablate_heads result(s) -> bar rows. Accepts one dict or a list of dicts."""
    if ablation is None:
        return []
    results = [ablation] if isinstance(ablation, dict) else list(ablation)
    rows = []
    for result in results:
        low, high = (result.get("ci95") or [float("nan"), float("nan")])[:2]
        delta = result["delta_loss"] if "delta_loss" in result else result["delta"]  # other metrics: delta
        rows.append({"label": ",".join(str(h) for h in result["heads"]), "delta": float(delta),
                     "low": float(low), "high": float(high), "method": result.get("method", "?"),
                     "n_tokens": result.get("n_tokens", "?")})
    return rows


def control_block(ablation) -> str:
    """Heads chosen by role against random head sets of the same per-layer counts (Wu et al. 2024's
    control): one row per ablate_heads result that carries a `control`; empty without any."""
    results = [] if ablation is None else [ablation] if isinstance(ablation, dict) else list(ablation)
    rows = []
    for result in results:
        control = result.get("control")
        if not control:
            continue
        deltas = sorted(control["deltas"])
        rows.append({"heads": result.get("chosen_by", ",".join(map(str, result["heads"]))),
                     "chosen": ",".join(map(str, result["heads"])), "metric": result["metric"],
                     "method": result["method"], "delta": result["delta"],
                     "random sets": control["k"], "random median": deltas[len(deltas) // 2],
                     "random min": deltas[0], "random max": deltas[-1],
                     "rank": f"{control['rank']} of {control['k'] + 1}", "p_value": control["p_value"]})
    if not rows:
        return ""
    words = ("Each chosen set is ablated, then as many random heads with the same number per layer (seeded); "
             "rank 1 is the largest absolute change, p the share of random sets changing the metric at least "
             "as much (Phipson & Smyth 2010). A role matters when its set stands out from the random ones.")
    return f"<h3>Roles against random heads</h3><p>{esc(words)}</p>" + table(pd.DataFrame(rows))


def validation_section(validation: pd.DataFrame) -> str:
    """The MHA validation table, failures highlighted."""
    failed = int((~validation["passed"].astype(bool)).sum()) if "passed" in validation else 0
    verdict = "every comparison passed" if failed == 0 else f"{failed} comparison(s) FAILED"
    source = validation.attrs.get("text_source")
    if source:
        verdict += f" (text: {source}, {validation.attrs.get('n_tokens', '?')} tokens)"
    body = (f'<p class="explain">{esc(explain.VALIDATION_TEXT)}</p><p><strong>{esc(verdict)}</strong>.</p>'
            + table(validation.reset_index(drop=True),
                    row_class=lambda row: "" if bool(row.get("passed", True)) else "failed"))
    return section("validation", "Validation of the attention maths", body)


def training_section(training) -> str:
    """Loss and score curves of the embedded model's training run, the phase change marked."""
    log, heads = training
    change = figures.phase_change_step(log)
    rule = (f"from below {figures.PHASE_LOW:g} to above {figures.PHASE_HIGH:g} within "
            f"{figures.PHASE_WINDOW_SHARE:.0%} of the run")
    note = (f"The dashed line marks step {change}: the best induction score rose {rule} (the phase change)."
            if change is not None else f"The best induction score never rose {rule}: no phase change is marked.")
    body = (f'<p class="explain">{esc(explain.TRAINING_TEXT)} {esc(note)}</p>'
            + figure(figures.training_uri(log, heads), "training dynamics")
            + details(f"training log ({len(log)} checkpoints)", table(log.reset_index(drop=True))))
    return section("training", "Training dynamics of the embedded model", body)
