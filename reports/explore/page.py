"""The explorer's one HTML page: every piece of prose from the message catalogue, no inline script.

The model's facts and the script's messages travel as JSON data blocks (not executed, so the page's
Content-Security-Policy can forbid inline scripts); the scripts and styles are this server's own
static files. The page's script (explore.js) builds on the report viewer's shared functions
(viewer_core.js).
"""

from __future__ import annotations

from headlens.reports.i18n import t
from headlens.reports.sections import esc
from headlens.reports.viewer import messages_block, safe_json


def _methods(lang: str) -> str:
    return "".join(
        f'<label><input type="radio" name="method" value="{m}"{" checked" if m == "zero" else ""}> '
        f"{esc(t(f'explore.method_{m}', lang))}</label> "
        for m in ("zero", "mean", "resample")
    )


def page_html(model: dict, lang: str = "en") -> str:
    """The page for a model described by Explorer.model_info()."""
    e = lambda key, **values: esc(t(key, lang, **values))  # noqa: E731 - a message, escaped
    title = e("explore.title", model=model["name"])
    return f"""<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/report.css">
<link rel="stylesheet" href="/static/explore.css">
</head>
<body>
<h1>{title}</h1>
<p class="explain">{e("explore.intro")}</p>
<noscript><p class="note">{e("explore.noscript")}</p></noscript>
<form id="text-form">
<label for="text">{e("explore.text_label", max_tokens=model["max_tokens"])}</label><br>
<textarea id="text" rows="4" cols="90" maxlength="20000"></textarea><br>
<button id="submit" type="submit">{e("explore.submit")}</button>
<span id="status" role="status" aria-live="polite"></span>
</form>
<div id="tokens" class="tokens" aria-label="{e("explore.tokens_label")}"></div>
<div id="main" hidden>
<section id="grid-section"><h2>{e("explore.grid_title")}</h2>
<p class="explain">{e("explore.grid_intro")}</p>
<p class="controls"><label>{e("explore.filter_label")} <select id="role-filter">
<option value="">{e("explore.filter_all")}</option></select></label>
<span id="legend"></span></p>
<div id="grid"></div></section>
<section id="head-section"><h2>{e("explore.head_title")}</h2>
<p class="explain">{e("explore.head_intro")}</p>
<div id="head-panel"><div id="head-figure"></div><table id="head-scores"></table></div></section>
<section id="row-section"><h2>{e("explore.row_title")}</h2>
<p class="explain">{e("explore.row_intro")}</p>
<p class="controls"><label>{e("explore.row_layer")} <select id="row-layer"></select></label></p>
<div id="row-panel"></div></section>
<section id="ablate-section"><h2>{e("explore.ablate_title")}</h2>
<p class="explain">{e("explore.ablate_intro")}</p>
<p class="controls"><label>{e("explore.role_pick")} <select id="ablate-role">
<option value="">{e("explore.role_none")}</option></select></label>
<button id="ablate-clear" type="button">{e("explore.clear")}</button>
<span id="ticked"></span></p>
<p class="controls">{e("explore.method_label")} {_methods(lang)}
<button id="ablate-go" type="button">{e("explore.ablate_go")}</button></p>
<p id="ablate-summary"></p>
<div id="ablate-tokens" class="tokens"></div>
<div class="tops"><table id="top-before"></table><table id="top-after"></table></div></section>
<section id="direct-section"><h2>{e("explore.direct_title")}</h2>
<p class="explain">{e("explore.direct_intro")}</p>
<p class="controls"><label>{e("explore.target_label")} <input id="direct-target" size="12"></label>
<label>{e("explore.foil_label")} <input id="direct-foil" size="12"></label>
<button id="direct-go" type="button">{e("explore.direct_go")}</button></p>
<p id="direct-summary"></p>
<div id="direct-map"></div></section>
</div>
{messages_block(lang)}
<script type="application/json" id="explore-model">{safe_json(model)}</script>
<script src="/static/viewer_core.js"></script>
<script src="/static/explore.js"></script>
</body>
</html>
"""
