"""Attention-pattern thumbnails of the labelled heads, readable at a glance.

Each pattern is a PNG of one pixel per weight that the page scales up with `image-rendering:
pixelated` (sharp blocks, small files); viridis scaled per head, the first column apart in white to
red on a fixed 0..1 scale so an attention sink shows as a solid stripe (figures.pattern_image_uri).
Short samples get their tokens as axis ticks. A click enlarges a pattern and a second click shrinks
it: a checkbox and CSS alone, so it works from file://, without JavaScript and under the page's CSP.
"""

from __future__ import annotations

import numpy as np

from headlens.classify.labels import roles_of
from headlens.classify.samples import patterns_of
from headlens.reports import figures
from headlens.reports.i18n import DEFAULT_LANG, quantity, t
from headlens.reports.sections import about, details, esc, labelled_heads, section
from headlens.results import Result

# Thumbnails show at most this many tokens of the sample (the viewer's sample is already capped).
THUMB_MAX_TOKENS = 256
# At most this many tokens are named on each axis (every token of a short sample; every k-th of a longer one).
TICK_MAX_TOKENS = 24
# More thumbnails than this are folded (a <details> element the reader opens); fewer show at once.
OPEN_MAX_THUMBS = 8
# Characters of a token shown as a tick.
TICK_CHARS = 8


def tick_text(token: str) -> str:
    """A token as a tick: newlines and tabs made visible, long tokens cut."""
    text = str(token).replace("\n", "\u21b5").replace("\t", "\u2192")
    return text if len(text) <= TICK_CHARS else text[: TICK_CHARS - 1] + "\u2026"


def tick_texts(tokens: list[str]) -> list[str]:
    """One tick per token: its text for every k-th token (k chosen so at most TICK_MAX_TOKENS are named,
    the first and the repeat's start among them), "" for the others."""
    step = -(-len(tokens) // TICK_MAX_TOKENS)  # ceil
    return [tick_text(token) if index % step == 0 else "" for index, token in enumerate(tokens)]


def thumbnail(pattern: np.ndarray, head: str, labels: list[str], tokens: list[str] | None, lang: str) -> str:
    """One head's pattern [q_pos, k_pos] as a clickable figure, with token ticks when `tokens` is given."""
    uri, vmax = figures.pattern_image_uri(pattern)
    ticks = ""
    if tokens:
        spans = "".join(f"<span>{esc(text)}</span>" for text in tick_texts(tokens))
        ticks = "".join(f'<span class="{axis}" aria-hidden="true">{spans}</span>' for axis in ("xticks", "yticks"))
    caption = t("thumbs.caption", lang, head=head, labels=", ".join(labels), vmax=quantity(vmax, lang))
    return (
        f'<figure class="thumb" data-head="{esc(head)}"><label class="zoom"><input type="checkbox" '
        f'class="zoom-toggle"><span class="pattern">{ticks}<img src="{uri}" '
        f'alt="{esc(t("thumbs.alt", lang, head=head))}"></span></label>'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def thumbnails_section(heads, viewer: Result, lang: str = DEFAULT_LANG) -> str:
    """Pattern thumbnails of every head with a role on the sample's first tokens, in a regular grid; heads
    that are only first-token sinks are counted, not drawn; many thumbnails are folded."""
    patterns = patterns_of(viewer).numpy()  # [layer, head, pos, pos]
    n = min(patterns.shape[-1], THUMB_MAX_TOKENS)
    labelled = labelled_heads(heads)
    chosen = [(layer, head, labels) for layer, head, labels in labelled if roles_of(labels)]
    if not chosen:
        return section("thumbnails", t("thumbs.title", lang), f"<p>{esc(t('thumbs.none', lang))}</p>")
    tokens = [str(token) for token in viewer.frame["token"][:n]]
    cells = [
        thumbnail(patterns[layer, head, :n, :n], f"{layer}.{head}", labels, tokens, lang)  # [q_pos, k_pos]
        for layer, head, labels in chosen
    ]
    sinks = len(labelled) - len(chosen)
    left_out = f"<p>{esc(t('thumbs.sinks_left_out', lang, n=sinks))}</p>" if sinks else ""
    grid = f'<div class="thumbs">{"".join(cells)}</div>'
    folded = len(cells) > OPEN_MAX_THUMBS
    scale = f'<p class="explain">{esc(t("thumbs.scale", lang))}</p>'
    body = (
        about(t("thumbs.intro", lang, n=n), lang, "thumbs.how")
        + left_out
        + (details(t("thumbs.open", lang, n=len(cells)), scale + grid) if folded else scale + grid)
    )
    return section("thumbnails", t("thumbs.title", lang), body)
