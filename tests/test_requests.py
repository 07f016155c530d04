"""The one-call entry points of `headlens circuit` and `headlens classify`: their specs read and check the
command line's values before any model loads (headlens.circuits.request, headlens.classify.request)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headlens.circuits.request import CircuitSpec, backups_of, circuit_document, with_backups
from headlens.classify.labels import ClassifyConfig
from headlens.classify.request import ClassifySpec
from headlens.errors import ConfigError, InputTextError
from headlens.results import Result


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"method": "patch"}, "unknown method 'patch': choose one of zero, mean, resample"),
        ({"method": "zero", "approx": "atp"}, "unknown --approx 'atp': choose one of eap, eap-ig, eap\\*"),
        ({"method": "zero", "discover": True}, "unknown --method 'zero' with --discover"),
        ({"control": "random:0"}, "control 'random:0'"),  # checked without --backups off the graph
        ({"discover": True, "backups": True, "control": "many"}, "control 'many'"),
    ],
)
def test_circuit_spec_refuses_what_cannot_run(given, message):
    with pytest.raises(ConfigError, match=message):
        CircuitSpec.parse(**given)


def test_circuit_spec_defaults_per_mode_and_reads_its_files(tmp_path):
    assert CircuitSpec.parse().method == "zero" and CircuitSpec.parse(discover=True).method == "eap-ig"
    assert CircuitSpec.parse(graph="g.json").method == "eap-ig" and CircuitSpec.parse(discover=True).steps == 5
    assert CircuitSpec.parse(discover=True, method="eap").method == "eap"  # EAP stays a choice
    assert CircuitSpec.parse(discover=True, backups=False, control="many").backups is None  # --control unread
    found = CircuitSpec.parse(discover=True)  # discover searches for backups by default, where the role has heads
    assert found.backups == 39 and found.backups_if_role
    asked = CircuitSpec.parse(discover=True, backups=True)  # asked for: a role without heads is an error
    assert asked.backups == 39 and not asked.backups_if_role
    assert CircuitSpec.parse().backups is None and CircuitSpec.parse(graph="g.json").backups is None
    assert CircuitSpec.parse(backups=True, control="random:7").backups == 7
    assert CircuitSpec.parse(graph="g.json").on_graph and not CircuitSpec.parse(heads="0.1").on_graph
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "When Mary and John went, John gave it to", "target": " Mary", "foil": " John"}\n')
    spec = CircuitSpec.parse(task="ioi", prompts_path=str(prompts))
    assert [p["target"] for p in spec.prompts] == [" Mary"]
    bad = tmp_path / "heads.json"
    bad.write_text("[1, 2]")
    with pytest.raises(InputTextError, match="--labels"):
        CircuitSpec.parse(labels_path=str(bad))


def test_backups_ride_along_and_come_back_out_unchanged():
    """with_backups keeps the circuit's own tables and meta; backups_of gives back the backups Result; the
    graph document names the backups last, as the command always printed them."""
    nodes = pd.DataFrame({"node": ["a0.h1"], "kind": ["head"], "layer": [0], "head": [1], "roles": [["induction"]]})
    edges = pd.DataFrame({"sender": ["a0.h1"], "receiver": ["logits"], "via": [""], "score": [0.5], "in_graph": [True]})
    curve = pd.DataFrame({"k": [1], "edges": [1], "nodes": [2], "faithfulness": [0.9]})
    graph = Result("circuit_graph", nodes, {"task": "induction", "n_edges": 1}, tables={"edges": edges, "curve": curve})
    found = Result("backups", pd.DataFrame({"head": ["1.2"], "compensation": [0.3]}), {"role": "induction"})
    both = with_backups(graph, found)
    assert backups_of(graph) is None and graph.tables.keys() == {"edges", "curve"}  # the original untouched
    back = backups_of(both)
    assert back.kind == "backups" and back.meta == found.meta and back.frame.equals(found.frame)
    assert both.frame is graph.frame and both.tables["edges"] is edges and both.meta["task"] == "induction"
    document = circuit_document(graph, {"name": "tiny"})
    assert list(document) == ["model", "task", "n_edges", "nodes", "edges", "curve"] and document["model"] == "tiny"
    assert json.loads(json.dumps(document))["nodes"][0]["roles"] == ["induction"]


def test_classify_spec_builds_the_config_and_folds_the_batch_size():
    spec = ClassifySpec.parse(seed=3, n_seq=None, needles=False, batch_size=2, thresholds=["positional=0.7"])
    default = ClassifyConfig()
    assert spec.config.seed == 3 and spec.config.n_seq == default.n_seq and not spec.config.needles
    assert spec.config.batch_size == 2 and not spec.auto_batch and spec.text is None
    assert spec.config.positional_min == 0.7 != default.positional_min
    auto = ClassifySpec.parse(batch_size="auto")
    assert auto.auto_batch and auto.config.batch_size == default.batch_size


def test_classify_spec_names_the_option_and_reads_files_before_a_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="--threshold prefix_matching=7.0 is out of range"):
        ClassifySpec.parse(thresholds=["prefix_matching=7"])
    with pytest.raises(InputTextError):
        ClassifySpec.parse(syntax=str(tmp_path / "missing.conllu"))
    with pytest.raises(InputTextError):
        ClassifySpec.parse(text_path=str(tmp_path / "missing.txt"))
