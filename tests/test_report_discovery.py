"""`headlens circuit --discover --report FILE.html`: the discovered circuit's page, in both languages.

On the small random GPT-2 of conftest.py with one head (1.2) labelled induction: the page carries the
discovery's introduction, how the circuit was scored and measured, the circuit drawn (heads coloured by
role, backups outlined), its faithfulness curve and the role's backups listed (`--backups`), every piece of
prose from the page's own language's catalogue; the JSON printed beside it carries the same backups. A
report path that cannot be written is refused before the work, in one line.
"""

from __future__ import annotations

import html
import itertools
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from headlens.classify import kinds
from headlens.cli.main import cli
from headlens.reports.circuit_figures import discovered_graph, discovery_document, task_title
from headlens.reports.i18n import t
from headlens.results import Result

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory, small_config):
    """1.2 labelled induction, no other head labelled."""
    heads = itertools.product(range(small_config.n_layer), range(small_config.n_head))
    rows = [{"layer": a, "head": b, "labels": ["induction"] * ((a, b) == (1, 2))} for a, b in heads]
    path = tmp_path_factory.mktemp("labels") / "heads.json"
    path.write_text(json.dumps(rows))
    return str(path)


def _args(model_dir, labels_file, *more):
    base = ["circuit", str(model_dir), "--task", "induction", "--discover", "--edges", "12", "--no-stability"]
    return [*base, "--labels", labels_file, "--backups", "--control", "random:3", *more]


def check_page(text: str, lang: str) -> None:
    """The discovery's introduction, the circuit's title, drawing and curve, and the backups' title."""
    keys = ("circuits.intro_discovered", "circuits.discovered_title", "circuits.discovered_alt", "circuits.curve_alt")
    for key in keys:
        assert t(key, lang) in text, key
    role = t(kinds.BY_LABEL["induction"].name_key, lang)
    assert t("circuits.backups_title", lang, role=role) in text


def _text(path) -> str:
    """The page's text as a reader sees it: entities decoded, white space collapsed."""
    return re.sub(r"\s+", " ", html.unescape(path.read_text(encoding="utf-8")))


def _discovery(task: str = "induction") -> Result:
    """A discovery Result's contract (headlens.circuits.discover), small and synthetic: 1.0 an induction head."""
    meta = {"task": task, "description": f"2 prompts of {task}", "method": "eap", "ablation": "patching"}
    meta.update(metric_full=1.0, metric_empty=0.0, faithfulness=0.9, cpr=0.5, cmd=0.5)
    edges = pd.DataFrame(
        [
            ("input", "a1.h0", "v", 0.5, True),
            ("a1.h0", "logits", "input", 0.7, True),
            ("a1.h2", "logits", "input", 0.2, True),
            ("a0.h1", "logits", "input", 0.1, False),
        ],
        columns=["sender", "receiver", "via", "score", "in_graph"],
    )
    curve = pd.DataFrame({"k": [1, 2], "edges": [1, 2], "nodes": [2, 3], "faithfulness": [0.4, 0.9]})
    frame = pd.DataFrame({"node": ["input", "a1.h0", "a1.h2", "logits"], "roles": [[], ["induction"], [], []]})
    return Result("circuit_graph", frame, meta, tables={"edges": edges, "curve": curve})


BACKUPS = {
    "task": "induction", "role": "induction", "label": "backup_induction", "ablated": ["1.0"], "method": "resample",
    "unit": "logits", "lost": 1.5, "total_effect": 0.4, "controls": 39, "exact": False, "p_min": 0.025,
    "alpha": 0.05, "min_share": 0.02, "seed": 0, "backups": ["1.2"], "detector": "ov_similarity", "auc": None,
    "heads": [{"head": "1.2", "layer": 1, "head_index": 2, "clean": 0.1, "ablated": 0.9, "compensation": 0.8,
               "p_value": 0.025, "controls": 39, "ov_similarity": 0.6, "backup": True}],
}  # fmt: skip


@pytest.mark.parametrize("lang", ["en", "es"])
def test_a_discovery_page_speaks_its_language(tmp_path, lang):
    from headlens.reports import render_report

    page = render_report(
        tmp_path / "c.html", model_info={"name": "m"}, circuits=[discovery_document(_discovery(), BACKUPS)], lang=lang
    )
    text = _text(page)
    check_page(text, lang)
    assert t("circuits.ablation.patching", lang) in text and t("circuits.task.induction", lang) in text
    assert "1.2" in text
    other = "es" if lang == "en" else "en"
    assert t("circuits.intro_discovered", other) not in text


def test_discover_report_draws_the_circuit_its_curve_and_the_backups(small_model_dir, labels_file, tmp_path):
    page = tmp_path / "circuit.html"
    got = CliRunner().invoke(cli, _args(small_model_dir, labels_file, "--format", "json", "--report", str(page)))
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    text = _text(page)
    check_page(text, "en")
    assert t("circuits.method_steps", "en", method="eap-ig", steps=5) in text  # the default method, named
    assert text.count('<img src="data:image/png;base64,') >= 2  # the circuit and its curve
    found = doc["backups"]
    assert found["role"] == "induction" and found["ablated"] == ["1.2"] and found["method"] == "resample"
    listed = [h["head"] for h in found["heads"] if h["backup"]]
    assert all(head in text for head in listed) and (listed or t("circuits.backups_none", "en") in text)
    f = t("circuits.discovered_size", "en", edges=doc["n_edges"], nodes=doc["n_nodes"], f="", cpr="", cmd="")
    assert f.split("f = ")[0] in text  # the circuit's own size, as the page words it
    table = CliRunner().invoke(cli, _args(small_model_dir, labels_file))
    assert table.exit_code == 0, table.output
    assert "backups of induction (1.2 resample-ablated" in table.output and "backups: " in table.output
    assert "circuit by eap-ig (5 steps, top edges): " in table.output  # no --method: the default, named


def test_a_discovery_document_names_a_users_task_by_its_file():
    doc = discovery_document(_discovery("my_task"))
    assert doc["task"]["name"] == "my_task" and doc["backups"] is None
    assert task_title("my_task", "es") == "my_task" and task_title("ioi", "es") == t("circuits.task.ioi", "es")
    assert [e["receiver"] for e in doc["discovered"]["edges"]] == ["a1.h0", "logits", "logits"]  # in the circuit
    marked = discovered_graph(doc["discovered"], set(BACKUPS["backups"]))
    assert marked.nodes["a1.h2"]["backup"] == "" and marked.nodes["a1.h0"]["backup"] is None  # 1.2 outlined
    assert marked.nodes["a1.h0"]["role"] == "induction"


def test_an_unwritable_report_is_refused_before_the_work(small_model_dir, labels_file, tmp_path):
    got = CliRunner().invoke(cli, _args(small_model_dir, labels_file, "--report", str(tmp_path)))
    assert got.exit_code == 2 and got.output.count("\n") == 1 and "Traceback" not in got.output
