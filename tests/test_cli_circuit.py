"""`headlens circuit`: the JSON contract (heads, edges, self_repair), the table, the report's section, and bad
input as one line with exit status 2. On the small random GPT-2 saved to disk, labels from a file."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from headlens.cli.main import cli

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

HEAD_KEYS = {"head", "labels", "direct_effect", "total_effect"}
EDGE_KEYS = {"sender", "receiver", "via", "composition", "effect", "attribution"}
REPAIR_KEYS = {"ablated", "total_effect", "direct_effect", "compensation"}


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory, small_config):
    records = [
        {"layer": layer, "head": head, "labels": ["previous_token"] if (layer, head) == (0, 1) else []}
        for layer in range(small_config.n_layer)
        for head in range(small_config.n_head)
    ]
    records[4 + 2]["labels"] = ["induction"]  # 1.2
    path = tmp_path_factory.mktemp("labels") / "heads.json"
    path.write_text(json.dumps(records))
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def ioi_doc(small_model_dir, labels_file):
    result = run(
        "circuit",
        str(small_model_dir),
        "--task",
        "ioi",
        "--ablate",
        "1.0,1.1",
        "--labels",
        labels_file,
        "--approx",
        "eap",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_json_holds_every_head_edge_and_the_compensation_table(ioi_doc, small_config):
    heads = ioi_doc["heads"]
    n_heads = small_config.n_layer * small_config.n_head
    assert len(heads) == n_heads and all(HEAD_KEYS <= set(h) for h in heads)
    assert {h["head"] for h in heads} == {f"{layer}.{head}" for layer in range(2) for head in range(4)}
    assert next(h for h in heads if h["head"] == "1.2")["labels"] == ["induction"]
    # the direct effects and the rest add up to the metric's linear part (here the metric itself)
    total = sum(h["direct_effect"] for h in heads) + sum(ioi_doc["rest"].values())
    assert total == pytest.approx(ioi_doc["task"]["clean"], abs=1e-4)
    assert ioi_doc["edges"] and all(EDGE_KEYS <= set(e) for e in ioi_doc["edges"])
    for edge in ioi_doc["edges"]:
        assert edge["via"] in ("q", "k", "v", "direct")
        assert (edge["receiver"] == "logits") == (edge["via"] == "direct")
        if edge["via"] != "direct":
            assert int(edge["sender"].split(".")[0]) < int(edge["receiver"].split(".")[0])
    attributed = [e for e in ioi_doc["edges"] if e["attribution"] is not None]
    assert attributed and ioi_doc["agreement"]["n_edges"] == sum(e["effect"] is not None for e in attributed)
    repair = ioi_doc["self_repair"]
    assert REPAIR_KEYS <= set(repair) and repair["ablated"] == ["1.0", "1.1"]
    assert len(repair["compensation"]) == n_heads - 2
    changes = [abs(c["change"]) for c in repair["compensation"]]
    assert changes == sorted(changes, reverse=True)
    for row in repair["compensation"]:
        assert row["change"] == pytest.approx(row["ablated"] - row["clean"])


@pytest.mark.slow
def test_the_table_and_the_report(small_model_dir, labels_file, tmp_path):
    page = tmp_path / "circuit.html"
    args = ["circuit", str(small_model_dir), "--task", "induction", "--labels", labels_file, "--ablate", "1.2"]
    result = run(*args, "--report", str(page), "--lang", "es")
    assert result.exit_code == 0, result.output
    assert "direct effects through the logits" in result.output and "self-repair:" in result.output
    html = page.read_text(encoding="utf-8")
    assert 'id="circuits"' in html and "Cómo trabajan juntas las cabezas" in html
    assert '<img src="data:image/png;base64,' in html


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--task", "copying"], "unknown task"),
        (["--task", "induction", "--prompts", "PROMPTS"], "--task ioi"),
        (["--ablate", "7.0"], "7.0"),
        (["--method", "noise"], "unknown method"),
        (["--approx", "atp"], "eap"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(small_model_dir, labels_file, tmp_path, args, words):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "When Mary and John went out, John thanked", "target": " Mary", "foil": " John"}\n')
    args = [str(prompts) if a == "PROMPTS" else a for a in args]
    result = run("circuit", str(small_model_dir), "--labels", labels_file, *args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error:") and words in lines[0], result.output
