"""The page's parts without a browser: one number style per quantity, the head map's sink dots inside their
cells and its tooltips' scores, the head panel's facts, one colour table, the role scatter plots, the viewer's
first head. Inputs are frames built here, each expected value written from the construction."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from headlens.classify.kinds import ROLES
from headlens.reports import circuits, i18n, sections
from headlens.reports.colours import ROLE_COLOURS, role_colour
from headlens.reports.headmap import head_map_svg
from headlens.reports.headpanel import head_facts
from headlens.reports.scatter import MARGIN, SIZE, role_scatter
from headlens.reports.viewer import strongest_induction_head


def built_heads() -> pd.DataFrame:
    """2 layers x 3 heads: two induction heads (1.1 stronger), a sink, a previous-token head, two with nothing."""
    return pd.DataFrame(
        {
            "layer": [0, 0, 0, 1, 1, 1],
            "head": [0, 1, 2, 0, 1, 2],
            "labels": [["first_token"], ["previous_token"], [], ["induction"], ["induction", "first_token"], []],
            "prefix_matching_score": [0.0, 0.1, 0.2, 0.6, 0.9, 0.3],
            "copying_score": [0.1, -0.2, 0.3, 0.7, 0.8, 0.2],
            "first_token_score": [0.9, 0.1, 0.1, 0.2, 0.8, 0.1],
            "positional_share": [0.1, 0.95, 0.1, 0.1, 0.1, 0.1],
            "prev_token_score": [0.0, 0.9, 0.0, 0.0, 0.0, 0.0],
        }
    )


def test_every_quantity_has_one_style_and_shares_are_not_raw():
    assert [i18n.quantity(v) for v in (0.70612, 0.9994, -0.8937, 4.0412, 0.00389)] == [
        "0.706",
        "0.999",
        "-0.894",
        "4.04",
        "0.00389",
    ]
    assert i18n.quantity(0.70612, "es") == "0,706"
    assert (
        i18n.percent(11 / 12) == "91.7%" and i18n.percent(0.05) == "5%" and i18n.percent(11 / 12, "es") == "91,7\u00a0%"
    )
    shown, _ = sections.format_cell({"last_word": 1 / 7, "n": 7}, "es")
    assert shown == "last_word 0,143; n 7"  # a probe's facts, not Python's repr


def test_sink_dots_sit_inside_their_cells_and_tooltips_carry_the_deciding_scores():
    heads = built_heads()
    svg = head_map_svg(heads, "en", facts=head_facts(heads, {}, None, "en"))
    cells = re.findall(r'<g data-head="([\d.]+)"[^>]*>(.*?)</g>', svg)
    assert len(cells) == 6
    sinks = 0
    for head, body in cells:
        x, y, w, h = (
            float(v)
            for v in re.search(
                r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" class="cell"', body
            ).groups()
        )
        for cx, cy, r in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="([\d.]+)"', body):
            cx, cy, r = float(cx), float(cy), float(r)
            assert x < cx - r and cx + r < x + w and y < cy - r and cy + r < y + h, head
            sinks += 1
    assert sinks == 2  # 0.0 and 1.1
    tip = dict(cells)["1.1"]
    assert "prefix matching 0.900 (cut-off 0.4)" in tip and "copying 0.800 (cut-off 0.5)" in tip


def test_a_heads_facts_give_its_roles_and_the_scores_beside_their_cut_offs():
    facts = head_facts(built_heads(), {}, [circuit_document()], "es")
    assert facts["1.1"]["roles"][0].startswith("Cabezas de inducción")
    assert facts["1.1"]["scores"][:2] == ["coincidencia de prefijo 0,900 (umbral 0,4)", "copia 0,800 (umbral 0,5)"]
    assert facts["1.1"]["edges"] == ["0.1 → 1.1 por k: 0,250"]
    assert facts["1.1"]["direct"] == [
        "Inducción sobre tokens aleatorios repetidos: efecto directo 1,20 logits (frases de este circuito)"
    ]
    assert facts["0.2"] == {"roles": [], "scores": [], "direct": [], "edges": [], "stability": []}


def circuit_document() -> dict:
    return {
        "task": {"name": "induction"},
        "heads": [{"head": "1.1", "direct_effect": 1.2}, {"head": "0.1", "direct_effect": 0.01}],
        "edges": [
            {"sender": "0.1", "receiver": "1.1", "via": "k", "effect": 0.25, "composition": 0.5},
            {"sender": "1.1", "receiver": "logits", "via": "direct", "effect": 1.2, "composition": None},
        ],
    }


def test_one_colour_per_role_from_one_table():
    assert len(set(ROLE_COLOURS.values())) == len(ROLE_COLOURS)
    for role, colour in circuits.COLOURS.items():
        assert colour == role_colour(role)
    stripes = re.findall(r'fill="(#[0-9a-f]{6})" data-role="(\w+)"', head_map_svg(built_heads(), "en"))
    assert len(stripes) == 3  # 0.1, 1.0 and 1.1 carry one role each
    for fill, role in stripes:
        assert fill == role_colour(role) and role in ROLES


def test_the_induction_scatter_puts_every_head_at_its_scores_with_the_cut_offs_drawn():
    heads = built_heads()
    svg = role_scatter(heads, "induction", {}, "en")
    dots = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3" fill="(#\w+)" data-head="([\d.]+)"', svg)
    assert len(dots) == 6
    low_x, high_x = 0.0, 1.0  # prefix matching spans 0..0.9: the axis 0..1
    low_y, high_y = -0.2, 1.0  # copying reaches -0.2
    for cx, cy, fill, head in dots:
        row = heads[[f"{r.layer}.{r.head}" == head for r in heads.itertuples()]].iloc[0]
        assert float(cx) == pytest.approx(
            MARGIN + (row.prefix_matching_score - low_x) / (high_x - low_x) * SIZE, abs=0.06
        )
        assert float(cy) == pytest.approx(10 + (1 - (row.copying_score - low_y) / (high_y - low_y)) * SIZE, abs=0.06)
        assert (fill == role_colour("induction")) == ("induction" in row.labels)
    cut_x = MARGIN + 0.4 * SIZE
    assert f'<line x1="{cut_x:.1f}"' in svg  # prefix matching's cut-off, 0.4
    assert re.search(r'class="name">1\.1<', svg) and re.search(r'class="name">1\.0<', svg)
    assert role_scatter(heads, "previous_token", {}, "en") == ""  # a rule of one cut score: no scatter


def test_the_viewer_opens_on_the_strongest_induction_head():
    assert strongest_induction_head(built_heads()) == "1.1"
    assert strongest_induction_head(built_heads().assign(labels=[[]] * 6)) is None
