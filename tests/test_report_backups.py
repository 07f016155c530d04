"""The circuit section's backups, discovered circuit and faithfulness curve (reports.circuit_figures), the role
colours' one table, and `headlens circuit --backups` (table, JSON, report) and `headlens explore --backups`.

The discovered circuit is drawn from a discovery Result's contract (frame: nodes with roles; tables `edges`
(sender, receiver, via, score, in_graph) and `curve` (edges, nodes, faithfulness); meta f, CPR, CMD), here a
small synthetic one built in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from headlens.classify import kinds
from headlens.cli.main import cli
from headlens.reports.circuit_figures import (
    backups_block,
    discovered_block,
    discovered_fields,
    discovered_graph,
    role_colour,
)
from headlens.reports.circuits import circuit_graph
from headlens.reports.i18n import t
from headlens.results import Result

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def _discovery() -> Result:
    nodes = pd.DataFrame(
        {
            "node": ["input", "a0.h1", "a1.h0", "a1.h2", "m1", "logits"],
            "roles": [[], ["previous_token"], ["induction"], ["backup_induction"], [], []],
        }
    )
    edges = pd.DataFrame(
        [
            ("input", "a0.h1", "v", 0.9, True),
            ("a0.h1", "a1.h0", "k", 0.7, True),
            ("a1.h0", "logits", "direct", 1.2, True),
            ("a1.h2", "logits", "direct", 0.3, True),
            ("m1", "logits", "direct", 0.2, True),
            ("input", "a1.h2", "q", 0.01, False),
        ],
        columns=["sender", "receiver", "via", "score", "in_graph"],
    )
    curve = pd.DataFrame({"edges": [1, 2, 4, 8], "nodes": [2, 3, 5, 6], "faithfulness": [0.1, 0.5, 0.85, 0.95]})
    meta = {"f": 0.95, "CPR": 0.7, "CMD": 0.3}
    return Result("circuit", nodes, meta, tables={"edges": edges, "curve": curve})


BACKUPS = {
    "task": "induction",
    "role": "induction",
    "label": "backup_induction",
    "ablated": ["1.0"],
    "method": "zero",
    "unit": "logits",
    "lost": 1.5,
    "total_effect": 0.4,
    "controls": 39,
    "exact": False,
    "p_min": 0.025,
    "alpha": 0.05,
    "min_share": 0.02,
    "seed": 0,
    "backups": ["1.2"],
    "detector": "ov_similarity",
    "auc": 0.75,
    "heads": [
        {"head": "1.2", "layer": 1, "head_index": 2, "clean": 0.1, "ablated": 0.9, "compensation": 0.8,
         "p_value": 0.025, "controls": 39, "ov_similarity": 0.6, "backup": True},
        {"head": "1.3", "layer": 1, "head_index": 3, "clean": 0.2, "ablated": 0.25, "compensation": 0.05,
         "p_value": 0.4, "controls": 39, "ov_similarity": 0.1, "backup": False},
    ],
}  # fmt: skip


def test_the_discovered_fields_keep_the_circuits_edges_and_curve():
    disc = discovered_fields(_discovery())
    assert len(disc["edges"]) == 5 and all(e["sender"] != "input" or e["receiver"] != "a1.h2" for e in disc["edges"])
    assert (disc["f"], disc["cpr"], disc["cmd"]) == (0.95, 0.7, 0.3)
    named = _discovery()
    named.meta = {"faithfulness": 0.9, "cpr": 0.6, "cmd": 0.4}  # the same figures under their long names
    assert discovered_fields(named)["f"] == 0.9
    graph = discovered_graph(disc)
    assert list(graph)[0] == "input" and list(graph)[-1] == "logits"
    assert graph.nodes["a1.h0"]["role"] == "induction" and graph.nodes["a1.h0"]["backup"] is None
    assert graph.nodes["a1.h2"]["backup"] == "induction"  # outlined dashed, filled with induction's colour
    assert graph.nodes["m1"]["layer"] == 1 and graph.nodes["a0.h1"]["layer"] == 0


def test_every_role_colour_is_the_registrys():
    for role in kinds.ROLES:
        assert role_colour(role) == kinds.BY_LABEL[role].colour
    doc = {
        "heads": [
            {"head": "0.1", "labels": ["previous_token"], "direct_effect": 0.5, "large_unlabelled": False},
            {"head": "1.2", "labels": ["backup_name_mover"], "direct_effect": 0.4, "large_unlabelled": False},
        ],
        "edges": [],
        "self_repair": None,
    }
    graph = circuit_graph(doc)
    assert graph.nodes["0.1"]["role"] == "previous_token" and graph.nodes["1.2"]["backup"] == "name_mover"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_blocks_speak_the_catalogues_language(lang):
    doc = {"discovered": discovered_fields(_discovery()), "backups": BACKUPS}
    html = discovered_block(doc, lang) + backups_block(doc, lang)
    assert html.count('<img src="data:image/png;base64,') == 2  # the circuit and its curve
    for key in ("circuits.discovered_title", "circuits.curve_alt", "circuits.discovered_alt"):
        assert t(key, lang) in html
    role = t(kinds.BY_LABEL["induction"].name_key, lang)
    assert t("circuits.backups_title", lang, role=role) in html
    assert html.count("<tr>") == 2  # the heading and the one backup; 1.3 is not one
    assert "1.2" in html and ">1.3<" not in html
    assert backups_block({}, lang) == discovered_block({}, lang) == ""


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory, small_config):
    """1.2 labelled induction, no other head labelled."""
    shape = (small_config.n_layer, small_config.n_head)
    heads = [divmod(index, shape[1]) for index in range(shape[0] * shape[1])]
    path = tmp_path_factory.mktemp("labels") / "heads.json"
    path.write_text(
        json.dumps([{"layer": a, "head": b, "labels": ["induction"] * ((a, b) == (1, 2))} for a, b in heads])
    )
    return str(path)


def test_circuit_backups_json_table_and_report(small_model_dir, labels_file, tmp_path):
    base = ["circuit", str(small_model_dir), "--task", "induction", "--labels", labels_file, "--backups"]
    result = CliRunner().invoke(cli, [*base, "--control", "random:3", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    found = doc["backups"]
    assert found["role"] == "induction" and found["ablated"] == ["1.2"] and found["controls"] == 3
    assert len(found["heads"]) == 7 and all(h["p_value"] >= found["p_min"] for h in found["heads"])
    for head in doc["heads"]:
        assert ("backup_induction" in head["labels"]) == (head["head"] in found["backups"])
    page = tmp_path / "c.html"
    result = CliRunner().invoke(cli, [*base, "--control", "random:3", "--report", str(page), "--lang", "es"])
    assert result.exit_code == 0, result.output
    assert "backups of induction" in result.output
    role = t(kinds.BY_LABEL["induction"].name_key, "es")
    assert t("circuits.backups_title", "es", role=role) in page.read_text(encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps(doc))
    bad = CliRunner().invoke(cli, [*base, "--control", "random:0"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "random:K" in bad.output


def test_discover_finds_backups_by_default_where_the_role_has_heads(small_model_dir, labels_file, tmp_path):
    base = ["circuit", str(small_model_dir), "--discover", "--method", "eap", "--no-stability", "--edges", "10"]
    found = CliRunner().invoke(cli, [*base, "--task", "induction", "--labels", labels_file, "--control", "random:3"])
    assert found.exit_code == 0, found.output
    assert "backups of induction (1.2 resample-ablated" in found.output
    nobody = tmp_path / "nobody.json"
    nobody.write_text(json.dumps([{**row, "labels": []} for row in json.loads(Path(labels_file).read_text())]))
    for task, labels, why in [
        ("induction", str(nobody), "no head is labelled induction"),
        ("greater-than", labels_file, "the greater-than task has no role"),
    ]:
        skipped = CliRunner().invoke(cli, [*base, "--task", task, "--labels", labels, "--format", "json"])
        assert skipped.exit_code == 0, skipped.output
        doc = json.loads(skipped.output)
        assert doc["backups_not_searched"] == why and "backups" not in doc
        table = CliRunner().invoke(cli, [*base, "--task", task, "--labels", labels])
        assert f"backups: not searched ({why})" in table.output
    refused = CliRunner().invoke(cli, [*base, "--task", "induction", "--labels", str(nobody), "--backups"])
    assert refused.exit_code == 2 and "no head is labelled 'induction'" in refused.output
    off = CliRunner().invoke(cli, [*base, "--task", "induction", "--labels", labels_file, "--no-backups"])
    assert off.exit_code == 0 and "backups" not in off.output


def test_explore_shows_what_a_head_backs_up(tmp_path):
    from headlens.circuits.backups import read_backups
    from headlens.errors import InputTextError
    from headlens.reports.explore import Explorer, create_app
    from tests.helpers.explore_setup import explore_client, tiny_setup

    path = tmp_path / "backups.json"
    path.write_text(json.dumps({"heads": [], "backups": BACKUPS}))
    backups = read_backups(path)
    assert backups == {
        "1.2": [{"role": "induction", "label": "backup_induction", "task": "induction", "compensation": 0.8,
                 "p_value": 0.025}]
    }  # fmt: skip
    loaded, frame, _ = tiny_setup()
    client = explore_client(create_app(Explorer(loaded, frame, backups=backups)))
    run = client.post("/api/run", json={"text": "one two three"}).json()["run"]
    head = client.get(f"/api/head?run={run}&layer=1&head=2").json()
    assert head["backups"] == backups["1.2"] and head["labels"][-1] == "backup_induction"
    assert client.get(f"/api/head?run={run}&layer=1&head=3").json()["backups"] == []
    (tmp_path / "bad.json").write_text('{"backups": {"heads": 3}}')
    with pytest.raises(InputTextError, match="holds no backups"):
        read_backups(tmp_path / "bad.json")


def test_the_roles_colours_are_distinct_and_the_explorer_sends_them(tmp_path):
    from headlens.reports.explore import Explorer
    from tests.helpers.explore_setup import tiny_setup

    colours = [kinds.BY_LABEL[role].colour.lower() for role in kinds.ROLES]
    assert len(set(colours)) == len(colours)  # no two roles look alike on any page
    loaded, frame, _ = tiny_setup()
    info = Explorer(loaded, frame).model_info()
    assert info["colours"] == {role: kinds.BY_LABEL[role].colour for role in info["roles"]} and info["colours"]
