"""The head map: one cell per head of a layers x heads grid, split into one stripe per role the head carries.

Drawn as inline SVG (crisp at any zoom, each cell a `<g data-head="L.H">` with its roles in `data-roles` and a
tooltip naming them) beside an HTML legend in the page's font, so every role of every head is visible and the
legend reads at the size of the text around it. Role colours come from the report's one colour table
(headlens.reports.colours); a head with no role is white; a dot in a cell's corner marks a first-token sink (a
property, not a role). The counts in the legend are `role_counts`, the same counts the role headings below the map give.
"""

from __future__ import annotations

import pandas as pd

from headlens.classify import kinds
from headlens.classify.labels import label_list
from headlens.reports.colours import NO_ROLE, SINK, role_colour
from headlens.reports.headpanel import TOOLTIP_SCORES
from headlens.reports.i18n import DEFAULT_LANG, t
from headlens.reports.sections import esc
from headlens.reports.viewer import safe_json

# Cell size in CSS pixels: wide enough for up to 6 stripes of 5 px, the whole map about 500 px at most.
CELL_WIDTH_RANGE, CELL_HEIGHT_RANGE, MAP_PIXELS = (30, 64), (14, 40), 480
# Room for the layer numbers (left) and the head numbers and the axis name (top).
LEFT, TOP = 44, 34
GRID = "#c8c8c8"


def head_roles(heads: pd.DataFrame) -> dict[tuple[int, int], tuple[list[str], list[str]]]:
    """(layer, head) -> (its roles in registry order, its properties) for every head of the frame."""
    found = {}
    for row in heads.itertuples():
        names = label_list(getattr(row, "labels", []))
        found[(int(row.layer), int(row.head))] = (
            [role for role in kinds.ROLES if role in names],
            [name for name in kinds.PROPERTIES if name in names],
        )
    return found


def role_counts(heads: pd.DataFrame) -> dict[str, int]:
    """Heads per role (a head with two roles counts in both), registry order, roles no head has left out."""
    counts = {role: 0 for role in kinds.ROLES}
    for roles, _ in head_roles(heads).values():
        for role in roles:
            counts[role] += 1
    return {role: n for role, n in counts.items() if n}


def overlaps(heads: pd.DataFrame) -> dict[tuple[str, ...], int]:
    """Combinations of two or more roles -> how many heads carry exactly that combination."""
    found: dict[tuple[str, ...], int] = {}
    for roles, _ in head_roles(heads).values():
        if len(roles) > 1:
            found[tuple(roles)] = found.get(tuple(roles), 0) + 1
    return found


def _clamp(value: float, bounds: tuple[int, int]) -> float:
    return max(bounds[0], min(bounds[1], value))


def head_map_svg(heads: pd.DataFrame, lang: str = DEFAULT_LANG, facts: dict | None = None) -> str:
    """The map as an `<svg>` element: numbered axes, one `<g>` per head with one rect per role; with `facts`
    (headlens.reports.headpanel.head_facts) each cell's tooltip adds its first deciding scores and the cell
    takes focus and clicks (the page script opens the head's panel)."""
    cells = head_roles(heads)
    n_layers = max(layer for layer, _ in cells) + 1
    n_heads = max(head for _, head in cells) + 1
    width = _clamp(MAP_PIXELS / n_heads, CELL_WIDTH_RANGE)
    height = _clamp(MAP_PIXELS / n_layers, CELL_HEIGHT_RANGE)
    total_w, total_h = LEFT + n_heads * width + 2, TOP + n_layers * height + 2
    names = {role: t(kinds.BY_LABEL[role].name_key, lang) for role in kinds.ROLES}
    parts = [
        f'<text x="{LEFT + n_heads * width / 2:.1f}" y="11" class="axis">{esc(t("fig.head", lang))}</text>',
        f'<text x="10" y="{TOP + n_layers * height / 2:.1f}" class="axis" '
        f'transform="rotate(-90 10 {TOP + n_layers * height / 2:.1f})">{esc(t("fig.layer", lang))}</text>',
    ]
    parts += [f'<text x="{LEFT + (h + 0.5) * width:.1f}" y="{TOP - 6}" class="tick">{h}</text>' for h in range(n_heads)]
    parts += [
        f'<text x="{LEFT - 5}" y="{TOP + (layer + 0.5) * height + 4:.1f}" class="tick end">{layer}</text>'
        for layer in range(n_layers)
    ]
    for (layer, head), (roles, properties) in sorted(cells.items()):
        x, y = LEFT + head * width, TOP + layer * height
        shown = [names[role] for role in roles] + [t(kinds.BY_LABEL[p].name_key, lang) for p in properties]
        tip = f"{layer}.{head}: {', '.join(shown) or t('cell.none', lang)}"
        scores = ((facts or {}).get(f"{layer}.{head}") or {}).get("scores", [])[:TOOLTIP_SCORES]
        tip += f" ({'; '.join(scores)})" if scores else ""
        stripes = [(NO_ROLE, "")] if not roles else [(role_colour(r), r) for r in roles]
        stripe = width / len(stripes)
        rects = "".join(
            f'<rect x="{x + i * stripe:.1f}" y="{y:.1f}" width="{stripe:.1f}" height="{height:.1f}" fill="{colour}"'
            + (f' data-role="{role}"' if role else "")
            + "/>"
            for i, (colour, role) in enumerate(stripes)
        )
        frame = f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" class="cell"/>'
        dot = (
            f'<circle cx="{x + width - 4:.1f}" cy="{y + 4:.1f}" r="2.2" fill="{SINK}" data-property="first_token"/>'
            if "first_token" in properties
            else ""
        )
        focus = ' tabindex="0" role="button"' if facts else ""
        parts.append(
            f'<g data-head="{layer}.{head}" data-roles="{" ".join(roles)}"{focus}><title>{esc(tip)}</title>'
            f"{rects}{frame}{dot}</g>"
        )
    return (
        f'<svg class="head-map-svg" role="img" aria-label="{esc(t("findings.map_alt", lang))}" '
        f'width="{total_w:.0f}" height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}">'
        f"{''.join(parts)}</svg>"
    )


def legend(heads: pd.DataFrame, lang: str = DEFAULT_LANG) -> str:
    """Every role some head carries, its colour and its head count; then the sink marker."""
    items = [
        f'<li data-role="{role}"><span class="swatch" style="background:{role_colour(role)}"></span>'
        f"{esc(t(kinds.BY_LABEL[role].name_key, lang))} ({n})</li>"
        for role, n in role_counts(heads).items()
    ]
    items.append(f'<li><span class="swatch sink"></span>{esc(t("fig.sink_marker", lang))}</li>')
    return f'<ul class="map-legend">{"".join(items)}</ul>'


def head_map(
    heads: pd.DataFrame, lang: str = DEFAULT_LANG, anchor: str | None = "head-map", facts: dict | None = None
) -> str:
    """The map and its legend in a div with id `anchor` (None: no id, for inline views that may repeat);
    "" without labels. With `facts` (headlens.reports.headpanel.head_facts, for the page's one map) the facts
    ride along as a JSON block and an empty panel follows the map, for the page script to fill on a click."""
    if "labels" not in heads or heads.empty:
        return ""
    ident = f' id="{esc(anchor)}"' if anchor else ""
    panel = (
        f'<script type="application/json" id="head-facts">{safe_json(facts)}</script>'
        '<div id="head-panel" class="head-panel" aria-live="polite" hidden></div>'
        if facts
        else ""
    )
    caption = t("findings.map_caption", lang) + (" " + t("findings.map_click", lang) if facts else "")
    return (
        f'<figure class="head-map"{ident}><div class="map-row">{head_map_svg(heads, lang, facts)}'
        f"{legend(heads, lang)}</div><figcaption>{esc(caption)}</figcaption></figure>{panel}"
    )
