"""Results shown inline in Jupyter and VS Code notebooks: HTML fragments with no network and no `<script src>`.

`view(result)` wraps a library result in an object that renders itself as the last expression of a cell
(IPython calls its `_repr_html_`; a headlens.Result calls `view` itself); `show(result)` displays it at once.
Recognised results: the Results (headlens.results) of classify_heads (score heatmaps + label table), sweep_heads
(heatmap of its metric's change), ablate_heads, one or a list (bars with 95% CIs, one chart per metric),
prune_curve and validate_model, the circuits' edge tables (the EDGE_ROWS largest edges), circuit (the report's
block of the task: graph, evidence, direct effects, self-repair), self_repair (its sentence and the EDGE_ROWS
largest compensating changes), load_training_log's and sample_patterns' Results (the
report's interactive attention viewer).
Return types of the library are untouched: the views only read them. Prose comes from the reports' message
catalogue (headlens.reports.i18n) in the language asked for (`lang="en"` or `"es"`); only the viewer's static
caption is this module's own.

Self-contained, as the report is: figures are PNG data URIs, the style and the script are inline. The viewer
runs report.js's `attentionViewer(suffix)` on elements whose ids end in a suffix drawn afresh at every render,
so several viewers in one page never clash. Where scripts do not run (an untrusted notebook in JupyterLab,
GitHub's notebook preview) a static picture of the default head's pattern stands in; the script
hides it once the interactive viewer is drawn.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import pandas as pd

from headlens.circuits.circuit import repair_document, to_document
from headlens.classify.samples import patterns_of, sample_patterns
from headlens.reports import circuits, figures, findings, sections
from headlens.reports.i18n import DEFAULT_LANG, check_lang, js_messages, t
from headlens.reports.viewer import default_viewer_tokens, report_script, safe_json, viewer_payload
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

# The inline views' own sentences (the rest is the reports' message catalogue, headlens.reports.i18n).
PROSE = {
    "en": {
        "viewer_static": "Static picture of head {head}'s pattern (rows: query token, columns: key token). "
        "The interactive viewer needs JavaScript: in Jupyter, run the cell again or trust "
        "the notebook."
    },
    "es": {
        "viewer_static": "Imagen fija del patrón de la cabeza {head} (filas: token de consulta, columnas: token "
        "de clave). El visor interactivo necesita JavaScript: en Jupyter, vuelve a ejecutar la "
        "celda o marca el cuaderno como de confianza."
    },
}

# Rows of the sweep's "needed most" table.
SWEEP_TOP_ROWS = 10
# Edges shown of a circuits edge table: the largest by magnitude of its measure.
EDGE_ROWS = 20
# The viewer's static stand-in is drawn this many pixels wide (one pixel per weight, scaled up).
STATIC_PIXELS = 256

# Scoped to .headlens-inline so that nothing else on the notebook page changes.
STYLE = """
.headlens-inline { font-family: system-ui, sans-serif; line-height: 1.4; }
.headlens-inline figure { display: inline-block; margin: 0.3em 1em 0.3em 0; vertical-align: top; }
.headlens-inline figcaption { font-size: 0.85em; color: #444; }
.headlens-inline .score { display: inline-block; max-width: 540px; margin-right: 1em; vertical-align: top; }
.headlens-inline .explain { font-size: 0.9em; max-width: 60em; }
.headlens-inline table { border-collapse: collapse; font-size: 0.85em; }
.headlens-inline th, .headlens-inline td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
.headlens-inline .tokens { font-family: ui-monospace, monospace; line-height: 2; margin: 0.5em 0; }
.headlens-inline .tok { display: inline-block; line-height: 1.3; white-space: pre; border: 1px solid #ccc;
  border-radius: 3px; padding: 1px 2px; margin: 1px; cursor: pointer; }
.headlens-inline .tok.query { outline: 2px solid #d00; }
.headlens-inline .viewer-grid canvas { display: block; cursor: pointer; border: 1px solid #ccc; }
.headlens-inline .viewer-grid canvas.chosen { border: 1px solid #d00; outline: 2px solid #d00; }
.headlens-inline .viewer-grid th { font-weight: normal; font-size: 0.8em; border: none; }
.headlens-inline .viewer-grid td { border: none; padding: 1px; }
.headlens-inline .static img { image-rendering: pixelated; border: 1px solid #ccc; }
.headlens-inline .map-row { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.headlens-inline .head-map-svg text { font: 11px system-ui, sans-serif; fill: #333; text-anchor: middle; }
.headlens-inline .head-map-svg text.end { text-anchor: end; }
.headlens-inline .head-map-svg rect.cell { fill: none; stroke: #c8c8c8; stroke-width: 1; }
.headlens-inline .map-legend { list-style: none; padding: 0; margin: 0; }
.headlens-inline .swatch { display: inline-block; width: 1.1em; height: 1.1em; vertical-align: -0.2em;
  margin-right: 0.4em; border: 1px solid #999; }
.headlens-inline .swatch.sink { border: none; width: 0.5em; height: 0.5em; border-radius: 50%; background: #000; }
"""


class InlineView:
    """A library result that renders itself in a notebook (`_repr_html_`); `html()` gives the fragment."""

    def __init__(self, result, heads: Result | None = None, lang: str = DEFAULT_LANG):
        self.kind = kind_of(result)
        self.result = result
        self.heads = heads  # a classification (classify_heads): the viewer's menu names each labelled head
        self.lang = check_lang(lang)  # language of the prose (headlens.reports.i18n.LANGS)

    def html(self) -> str:
        """The HTML fragment; element ids get a fresh suffix at every call."""
        return render_html(self.result, heads=self.heads, lang=self.lang)

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"<headlens {self.kind} view: display it in a notebook, or call .html()>"


def view(result, heads: Result | None = None, lang: str = DEFAULT_LANG) -> InlineView:
    """`result` as an InlineView; TypeError when it is no result headlens knows how to draw."""
    return InlineView(result, heads=heads, lang=lang)


def show(result, heads: Result | None = None, lang: str = DEFAULT_LANG) -> None:
    """Display `result` in the running notebook (IPython.display); RuntimeError outside IPython."""
    inline = view(result, heads=heads, lang=lang)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        raise RuntimeError(
            "show() displays in a Jupyter or VS Code notebook (IPython); elsewhere write a page "
            "with `headlens report` or take the fragment from headlens.reports.inline.view(result)"
            ".html()"
        )
    display(inline)


def attention_sample(loaded: LoadedModel, text: str, max_tokens: int | None = None, repeat: bool = False) -> Result:
    """sample_patterns on `text`, `max_tokens` defaulting to the report's viewer length for this model."""

    spec = loaded.spec
    n = max_tokens or default_viewer_tokens(spec.n_layers, spec.n_heads, spec.n_ctx)
    return sample_patterns(loaded, text, n, repeat=repeat)


# What each result looks like


def _is_ablation(value) -> bool:
    return isinstance(value, Result) and value.kind == "ablation"


def kind_of(result) -> str:
    """A Result's kind (headlens.results.KINDS) | ablation (a list) | training | attention; TypeError otherwise."""
    if isinstance(result, Result) and result.kind == "sample":
        return "attention"
    if isinstance(result, Result):
        return result.kind
    if isinstance(result, list) and result and all(_is_ablation(r) for r in result):
        return "ablation"
    raise TypeError(
        f"headlens cannot display a {type(result).__name__} of this shape: it shows the Results of "
        "classify_heads, sweep_heads, ablate_heads, prune_curve, validate_model and the circuits' functions "
        "load_training_log and sample_patterns (not their .frame alone, which has lost its metadata)"
    )


def render_html(result, heads: Result | None = None, lang: str = DEFAULT_LANG) -> str:
    """The self-contained fragment of one result (see the module docstring), its prose in `lang`."""
    kind = kind_of(result)
    lang = check_lang(lang)
    suffix = "-hl" + secrets.token_hex(6)
    body = {
        "heads": lambda: heads_html(result, lang),
        "sweep": lambda: sweep_html(result, lang),
        "ablation": lambda: ablation_html(result, lang),
        "pruning": lambda: pruning_html(result.frame, lang),
        "validation": lambda: validation_html(result.frame, lang),
        "edges": lambda: edges_html(result, lang),
        "circuit": lambda: circuits.task_block(to_document(result), lang),
        "self_repair": lambda: repair_html(result, lang),
        "training": lambda: sections.training_figure(result, lang),
        "attention": lambda: attention_html(result, None if heads is None else heads.frame, suffix, lang),
    }[kind]()
    return (
        f'<div class="headlens-inline" data-kind="{kind}" lang="{lang}" id="headlens{suffix}">'
        f"<style>{STYLE}</style>{body}</div>"
    )


def esc(text: str) -> str:
    return sections.esc(text)


def heads_html(heads: Result, lang: str) -> str:
    """The role map (findings.head_map), the roles no head earned (findings.absent_block), one heatmap
    per score present (explain.SCORES) with its threshold, then the label table."""
    frame = heads.frame
    parts = [
        findings.head_map(frame, lang, anchor=None),
        findings.absent_block(heads, lang, anchor=None),
        f'<p class="explain">{esc(t("scores.intro", lang))}</p>',
    ]
    for info, uri, cut in sections.score_heatmaps(heads, lang):
        parts.append(
            f'<div class="score"><strong>{esc(info.title(lang))}</strong>'
            f"{sections.figure(uri, t('scores.heatmap_alt', lang, column=info.column))}"
            f'<p class="explain">{esc(info.what(lang) + cut)} <cite>{esc(info.source(lang))}</cite></p></div>'
        )
    parts.append(f"<p><strong>{esc(t('scores.labels_title', lang))}</strong></p>")
    labels = sections.label_frame(frame, lang)
    if "kv_group" in frame and (frame["kv_group"] != frame["head"]).any():  # grouped-query attention
        groups = {f"{r.layer}.{r.head}": int(r.kv_group) for r in frame.itertuples()}
        labels.insert(1, "kv_group", labels["head"].map(groups))  # the label table has its own row order
    parts.append(sections.table(labels, sortable=False, lang=lang))
    return "\n".join(parts)


def sweep_html(sweep: Result, lang: str) -> str:
    """The heatmap of the change of the sweep's metric, then the heads the model needs most."""
    return (
        f'<p class="explain">{esc(t("ablation.text", lang))}</p><p><strong>'
        f"{esc(t('ablation.sweep_title', lang))}</strong></p>"
        + sections.sweep_block(sweep, lang, top_rows=SWEEP_TOP_ROWS, sortable=False)
    )


def ablation_html(result, lang: str) -> str:
    """Per metric: bars of the change with their 95% CIs, then every number of each ablation."""
    results = sections.results_list(result)
    keys = [
        "heads",
        "method",
        "metric",
        "unit",
        "n",
        "clean",
        "ablated",
        "delta",
        "n_tokens",
        "loss",
        "loss_ablated",
        "delta_loss",
        "ci95",
    ]
    frame = pd.DataFrame([{key: r.get(key) for key in keys if any(key in other for other in results)} for r in results])
    return (
        f'<p class="explain">{esc(t("ablation.text", lang))}</p>'
        + sections.chosen_blocks(result, lang, sortable=False)
        + sections.table(frame, sortable=False, lang=lang)
    )


def pruning_html(frame: pd.DataFrame, lang: str) -> str:
    return (
        f"<p><strong>{esc(t('ablation.pruning_title', lang))}</strong></p>"
        + sections.figure(figures.pruning_curve_uri(frame, lang), t("ablation.pruning_alt", lang))
        + sections.table(frame.reset_index(drop=True), sortable=False, lang=lang)
    )


def validation_html(frame: pd.DataFrame, lang: str) -> str:
    failed = int((~frame["passed"].astype(bool)).sum())
    verdict = t("validation.passed", lang) if failed == 0 else t("validation.failed", lang, n=failed)
    return (
        f'<p class="explain">{esc(t("validation.text", lang))}</p><p><strong>{esc(verdict)}</strong></p>'
        + sections.table(frame.reset_index(drop=True), sortable=False, lang=lang)
    )


def edges_html(edges: Result, lang: str) -> str:
    """The EDGE_ROWS edges largest in magnitude of the table's measure (its meta's `measure` column)."""
    frame = edges.frame
    column = edges.meta.get("measure")
    if column in frame:
        frame = frame.reindex(frame[column].abs().sort_values(ascending=False, kind="stable").index)
    return sections.table(frame.head(EDGE_ROWS).reset_index(drop=True), sortable=False, lang=lang)


def repair_html(repair: Result, lang: str) -> str:
    """The self-repair sentence and the EDGE_ROWS heads whose direct effect changes most."""
    text = circuits.repair_text(repair_document(repair.meta, repair.frame), lang)
    return f"<p>{esc(text)}</p>" + sections.table(repair.frame.head(EDGE_ROWS), sortable=False, lang=lang)


def attention_html(sample: Result, heads: pd.DataFrame | None, suffix: str, lang: str) -> str:
    """The report's viewer (report.js) on elements whose ids end in `suffix`, and a static stand-in."""
    payload = viewer_payload(sample, heads, lang)
    layer, head = (int(x) for x in payload["default_head"].split("."))
    patterns = patterns_of(sample).numpy()  # [layer, head, pos, pos]
    static, _ = figures.pattern_image_uri(patterns[layer, head])  # [q_pos, k_pos] -> PNG, a pixel per weight
    total, shown = sample.meta.get("n_tokens_total"), payload["pos"]
    cut = (
        t("viewer.cut", lang, total=total, shown=shown)
        if isinstance(total, int) and total > shown
        else t("viewer.all", lang, shown=shown)
    )
    if sample.meta.get("repeated"):
        cut = t("viewer.repeated", lang, shown=shown)
    caption = PROSE[lang]["viewer_static"].format(head=f"{layer}.{head}")
    s = suffix
    return f"""<p class="explain">{esc(t("viewer.intro", lang, cut=cut))}</p>
<div class="static" id="viewer-static{s}"><figure><img src="{static}" alt="{esc(caption)}"
style="width: {STATIC_PIXELS}px; height: {STATIC_PIXELS}px"><figcaption>{esc(caption)}</figcaption></figure></div>
<div id="viewer-app{s}" hidden>
<p><label>{esc(t("viewer.head_menu", lang))} <select id="viewer-head{s}"></select></label>
<span id="viewer-status{s}" aria-live="polite"></span></p>
<div id="viewer-tokens{s}" class="tokens"></div>
<div id="viewer-grid{s}" style="overflow-x: auto"></div>
</div>
<script type="application/json" id="viewer-data{s}">{safe_json(payload)}</script>
<script>{viewer_script(s, lang)}</script>"""


def viewer_script(suffix: str, lang: str) -> str:
    """report.js inside a function scope with its messages in `lang`, then the viewer of `suffix`; drawn once
    even if run twice."""
    script = report_script()
    return (
        f"(function () {{\n{script}\nMESSAGES = {safe_json(js_messages(lang))};\n"
        f"var app = document.getElementById({safe_json('viewer-app' + suffix)});\n"
        'if (!app || app.getAttribute("data-drawn")) { return; }\n'
        f'attentionViewer({safe_json(suffix)});\napp.setAttribute("data-drawn", "1");\n'
        f"var still = document.getElementById({safe_json('viewer-static' + suffix)});\n"
        "if (still && !app.hidden) { still.hidden = true; }\n})();"
    )
