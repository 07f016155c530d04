"""The main report's "How the heads work together" section (headlens.circuits.overview + reports/circuits.py) on
the planted model: a previous-token head planted to be read by the induction head's keys, and a decoy
previous-token head whose write nothing reads (tests/helpers/planted_circuits.py). Both carry the previous_token
label, as an attention-only labeller would give them; the weights tell them apart."""

from __future__ import annotations

from html import unescape

import pytest

from headlens.circuits.overview import overview_documents
from headlens.heads import Head
from headlens.reports.circuits import circuit_graph, circuit_section, role_lines
from headlens.reports.i18n import t
from tests.helpers.planted_circuits import build_planted_decoy, decoy_seeds

Z_SOURCE = 10.0  # the planted source stands this many random-baseline deviations above the mean
Z_RANDOM = 3.0  # the decoy, read by nothing, stays within 3 deviations of random


@pytest.fixture(scope="module", params=decoy_seeds(1))
def planted(request):
    planted = build_planted_decoy(request.param)
    pos = planted.positions
    labels = {
        Head(*pos["induction"]): ["induction"],
        Head(*pos["previous_token"]): ["previous_token"],
        Head(*pos["decoy"]): ["previous_token"],
    }
    return planted, overview_documents(planted.loaded, labels)


def _name(planted, role: str) -> str:
    return "{}.{}".format(*planted.positions[role])


def test_the_induction_head_is_fed_by_the_planted_source_via_k_and_not_by_the_decoy(planted):
    planted, docs = planted
    induction = next(d for d in docs if d["task"]["name"] == "induction")
    into = [e for e in induction["edges"] if e["receiver"] == _name(planted, "induction")]
    assert (into[0]["sender"], into[0]["via"]) == (_name(planted, "previous_token"), "k")
    assert into[0]["composition_z"] > Z_SOURCE and into[0]["effect"] is None
    decoy = [e for e in into if e["sender"] == _name(planted, "decoy")]
    assert decoy and decoy[0]["composition_z"] < Z_RANDOM
    graph = circuit_graph(induction)
    assert graph.has_edge(_name(planted, "previous_token"), _name(planted, "induction"))
    assert graph.edges[_name(planted, "previous_token"), _name(planted, "induction")]["kind"] == "k"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_section_cites_the_evidence_in_both_languages(planted, lang):
    planted, docs = planted
    html = unescape(circuit_section(docs, lang))
    assert t("circuits.title", lang) in html and t("circuits.intro_weights", lang) in html
    source, receiver = _name(planted, "previous_token"), _name(planted, "induction")
    cited = t("circuits.source_weights", lang, sender=source, via="K", composition="", z="").split("(")[0]
    fed = [line for line in html.split("<li>") if line.startswith(receiver)]
    assert fed and cited in fed[0]  # the induction head's line cites the planted source via K


def test_heads_with_a_large_direct_effect_and_no_role_are_listed_without_a_kind(planted):
    planted, docs = planted
    for doc in docs:
        large = [h for h in doc["heads"] if h["large_unlabelled"]]
        share = doc["large_share"] * abs(doc["task"]["logit_metric"])
        assert all(abs(h["direct_effect"]) >= share and not h["labels"] for h in large)
        html = unescape(circuit_section([doc], "en"))
        if large:
            assert t("circuits.unlabelled", "en", heads=", ".join(h["head"] for h in large), share="")[:30] in html


def test_the_induction_role_cites_its_feeding_heads(planted):
    planted, docs = planted
    lines = role_lines(docs, "induction", "en")
    receiver, source = _name(planted, "induction"), _name(planted, "previous_token")
    assert len(lines) == 1 and lines[0].startswith(receiver) and f"{source} via K" in lines[0]
    assert role_lines(docs, "name_mover", "en") == []  # no head holds that role here
