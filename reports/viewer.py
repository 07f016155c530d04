"""The interactive attention viewer: sample tokens and every head's pattern, inline as JSON.

Patterns are quantised to one byte per weight (0..255, i.e. steps of 1/255) and base64-encoded
inside the JSON, so GPT-2 small's 12 x 12 heads over 64 tokens take ~0.8 MB instead of ~3.5 MB
of decimal text. The JSON is embedded so that no text can end the script element.
"""

from __future__ import annotations

import base64
import json
import math
from importlib import resources

import numpy as np

from headlens.classify.labels import label_list
from headlens.classify.samples import PREFIX_MATCHING_MIN, patterns_of
from headlens.reports.i18n import DEFAULT_LANG, js_messages, quantity, short_number, t
from headlens.reports.sections import about, esc, labelled_heads, section
from headlens.results import Result

# Weights the viewer embeds at most by default: GPT-2 small's 12 x 12 heads over 44 tokens, which leaves room on a
# 270-head report such as SmolLM2's (32 tokens) for the head panel's data, the score scatter plots and the small
# multiples within its 1.5 MB target (tests/test_browser.py); smaller models get longer samples for the same bytes.
VIEWER_WEIGHT_BUDGET = 12 * 12 * 44 * 44
# Longest default sample: beyond this the token row gets hard to read.
VIEWER_MAX_TOKENS = 256


def default_viewer_tokens(n_layers: int, n_heads: int, n_ctx: int) -> int:
    """Sample length for the viewer: as many tokens as VIEWER_WEIGHT_BUDGET allows, capped."""
    return max(2, min(n_ctx, VIEWER_MAX_TOKENS, math.isqrt(VIEWER_WEIGHT_BUDGET // (n_layers * n_heads))))


# Characters that could end a <script> element or break a JS string when JSON sits inside HTML.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def safe_json(data) -> str:
    """json.dumps with <, >, &, U+2028 and U+2029 escaped: safe inside <script type="application/json">."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return "".join(_JSON_ESCAPES.get(ch, ch) for ch in text)


def viewer_payload(viewer: Result, heads=None, lang: str = DEFAULT_LANG) -> dict:
    """The viewer's data: tokens, shape, quantised patterns (base64 of uint8 [layer, head, q, k]), labels.
    `viewer`: a sample Result (headlens.classify.samples.sample_patterns)."""
    tokens, n_weights = viewer.frame["token"], len(viewer.tables["patterns"])
    if n_weights != viewer.meta["n_layers"] * viewer.meta["n_heads"] * len(tokens) ** 2:
        raise ValueError(t("error.viewer_shape", lang, shape=(n_weights,), n_tokens=len(tokens)))
    patterns = patterns_of(viewer).numpy()  # [layer, head, pos, pos]
    quantised = np.rint(np.clip(patterns, 0.0, 1.0) * 255).astype(np.uint8)  # [layer, head, pos, pos]
    labels = {f"{layer}.{head}": ", ".join(names) for layer, head, names in labelled_heads(heads)}
    first = strongest_induction_head(heads) or next(iter(labels), "0.0")
    return {
        "tokens": [str(t) for t in tokens],
        "ids": [int(i) for i in viewer.frame["id"]] if "id" in viewer.frame else [],  # checkable by a peer
        "n_layers": int(patterns.shape[0]),
        "n_heads": int(patterns.shape[1]),
        "pos": int(patterns.shape[2]),
        "patterns_b64": base64.b64encode(quantised.tobytes()).decode("ascii"),
        "labels": labels,
        "default_head": first,
    }


def strongest_induction_head(heads) -> str | None:
    """ "L.H" of the induction head of highest prefix-matching score (the head the viewer's caption speaks of,
    shown first), None when no head carries the induction label."""
    if heads is None or "labels" not in heads or "prefix_matching_score" not in heads:
        return None
    induction = heads[[("induction" in label_list(labels)) for labels in heads["labels"]]]
    if induction.empty:
        return None
    best = induction.loc[induction["prefix_matching_score"].idxmax()]
    return f"{int(best['layer'])}.{int(best['head'])}"


def report_script() -> str:
    """The report's one script: the attention views shared with the explorer (viewer_core.js), then report.js."""
    folder = resources.files("headlens.reports")
    return "\n".join((folder / name).read_text(encoding="utf-8") for name in ("viewer_core.js", "report.js"))


def messages_block(lang: str = DEFAULT_LANG) -> str:
    """The page script's messages in the report's language, as a JSON data block (report.js reads it)."""
    return f'<script type="application/json" id="report-messages">{safe_json(js_messages(lang))}</script>'


def repeated_caption(viewer: Result, shown: int, lang: str = DEFAULT_LANG) -> str:
    """What a repeated sample is, and why: the text's start twice, or random tokens twice when the model
    does not copy the text or its induction heads do not prefix-match on it (headlens.classify.samples measured it)."""
    facts = viewer.meta
    if facts.get("sample") != "random_tokens":
        return t("viewer.repeated", lang, shown=shown)
    on_text = facts.get("text_prefix_matching")
    if on_text:  # the model copies the text, but its induction heads do not prefix-match on it
        head, low = min(on_text.items(), key=lambda item: item[1])
        return t(
            "viewer.repeated_random_heads",
            lang,
            period=(shown - 1) // 2,
            shown=shown,
            low=quantity(low, lang),
            head=head,
            threshold=short_number(PREFIX_MATCHING_MIN, lang),
        )
    first, second = facts.get("copy_loss") or (float("nan"), float("nan"))
    return t(
        "viewer.repeated_random",
        lang,
        period=(shown - 1) // 2,
        shown=shown,
        first=quantity(first, lang),
        second=quantity(second, lang),
    )


def viewer_section(viewer: Result, heads=None, lang: str = DEFAULT_LANG) -> str:
    """Tokens to click, a layer x head grid of attention rows, and one chosen head's weights on the tokens."""
    payload = viewer_payload(viewer, heads, lang)
    total = viewer.meta.get("n_tokens_total")
    shown = payload["pos"]
    cut = (
        t("viewer.cut", lang, total=total, shown=shown)
        if isinstance(total, int) and total > shown
        else t("viewer.all", lang, shown=shown)
    )
    if viewer.meta.get("repeated"):
        cut = repeated_caption(viewer, shown, lang)
    body = f"""{about(t("viewer.intro", lang, cut=cut), lang, "viewer.how")}
<noscript><p class="note">{esc(t("viewer.noscript", lang))}</p></noscript>
<div id="viewer-app" hidden>
<p class="controls"><label>{esc(t("viewer.head_menu", lang))} <select id="viewer-head"></select></label>
<span id="viewer-status" aria-live="polite"></span></p>
<div id="viewer-tokens" class="tokens"></div>
<div id="viewer-grid"></div>
</div>
<script type="application/json" id="viewer-data">{safe_json(payload)}</script>"""
    return section("viewer", t("viewer.title", lang), body)
