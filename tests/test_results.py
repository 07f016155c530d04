"""headlens.results: one shape for every stage's result, a frame with its metadata, that no combination can
silently strip (pandas' `DataFrame.attrs`, which `pd.concat` drops, holds none of it)."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest

import headlens
from headlens.classify import ClassifyConfig, classify_heads
from headlens.reports import render_report
from headlens.reports.pipeline import model_info
from headlens.results import Result, concat_results

FAST = ClassifyConfig(n_seq=2, max_windows=2, needles=False)  # the small probes of tests/test_classify.py
TEXT = "The cat sat on the mat. The dog sat on the log. " * 8


@pytest.fixture(scope="module")
def two_classifications(small_model):
    """A classification, the same one again (classify_heads is deterministic under its seed,
    tests/test_classify.py: a second run is not repeated here, a classification is one of the slower fixtures), and
    one whose labels were given under another positional cut-off."""
    first = classify_heads(small_model, text=TEXT, config=FAST)
    again = Result("heads", first.frame.copy(), copy.deepcopy(first.meta))
    other = Result("heads", first.frame.copy(), copy.deepcopy(first.meta))
    other.meta["config"]["positional_min"] = 0.8
    return first, again, other


def test_every_stage_returns_a_result_with_its_metadata_beside_the_frame(two_classifications):
    heads = two_classifications[0]
    assert isinstance(heads, Result) and heads.kind == "heads"
    assert isinstance(heads.frame, pd.DataFrame) and heads.frame.attrs == {}  # nothing for pandas to drop
    assert {"model", "probes", "sources", "config"} <= set(heads.meta)
    assert heads.meta["config"]["positional_min"] == FAST.positional_min
    assert len(heads) == 2 * 4  # 2 layers x 4 heads


def test_pd_concat_of_two_classifications_is_refused_with_the_way_that_keeps_the_metadata(two_classifications):
    first, again, _ = two_classifications
    with pytest.raises(TypeError, match="headlens.concat_results"):
        pd.concat([first, again])


def test_concat_results_keeps_what_the_report_needs(two_classifications, small_model, tmp_path):
    first, again, _ = two_classifications
    both = headlens.concat_results([first, again])
    assert both.kind == "heads" and both.meta == first.meta
    assert len(both) == len(first) + len(again)
    assert both.frame.index.tolist() == list(range(len(both)))
    pd.testing.assert_frame_equal(both.frame.iloc[: len(first)].reset_index(drop=True), first.frame)
    page = render_report(tmp_path / "both.html", model_info=model_info(small_model), heads=both)
    text = page.read_text(encoding="utf-8")
    assert 'id="probe-sizes"' in text  # the probe sizes come from the kept meta
    assert "positional_min" in text  # the settings table: the config the labels were given under


def test_concat_results_refuses_results_measured_under_different_metadata(two_classifications):
    first, _, other = two_classifications
    with pytest.raises(ValueError, match="config"):
        concat_results([first, other])
    sweep = Result("sweep", pd.DataFrame({"layer": [0], "head": [0], "delta": [0.1]}), {"metric": "loss"})
    with pytest.raises(TypeError, match="one kind"):
        concat_results([first, sweep])
    with pytest.raises(TypeError, match="Result"):
        concat_results([first.frame, first.frame])


def test_a_bare_frame_cannot_reach_a_report_or_an_inline_view(two_classifications, small_model, tmp_path):
    """A user's `pd.concat` of the frames has no metadata: the report and the views refuse it, not guess."""
    first, again, _ = two_classifications
    joined = pd.concat([first.frame, again.frame], ignore_index=True)
    with pytest.raises(TypeError, match="lost its metadata"):
        render_report(tmp_path / "bare.html", model_info=model_info(small_model), heads=joined)
    with pytest.raises(TypeError, match="not their .frame alone"):
        headlens.view(joined)
    assert not (tmp_path / "bare.html").exists()


def test_to_json_is_one_document_of_kind_meta_and_rows(two_classifications):
    heads = two_classifications[0]
    document = json.loads(heads.to_json())
    assert set(document) == {"kind", "meta", "rows"} and document["kind"] == "heads"
    assert document["meta"]["sources"] == heads.meta["sources"]
    assert len(document["rows"]) == len(heads.frame)
    first = heads.frame.iloc[0]
    assert document["rows"][0]["layer"] == int(first["layer"]) and document["rows"][0]["labels"] == first["labels"]
    for column in ("copying_score", "prev_token_score"):
        expected = float(first[column])
        got = document["rows"][0][column]
        assert (got is None) if math.isnan(expected) else got == expected


def test_a_result_draws_itself_inline(two_classifications):
    heads = two_classifications[0]
    html = heads._repr_html_()
    assert 'data-kind="heads"' in html and "<script src" not in html
    assert "heads result" in repr(heads) and "config" in repr(heads)


def test_an_ablation_is_a_result_whose_frame_repeats_its_numbers(small_model):
    result = headlens.ablate_heads(small_model, "0.1,1.2", tokens=64, control=2)
    assert result.kind == "ablation"
    row = result.frame.iloc[0]
    assert row["set"] == "chosen" and row["heads"] == "0.1,1.2"
    assert row["delta"] == result.meta["delta"] and [row["ci95_low"], row["ci95_high"]] == list(result.meta["ci95"])
    controls = result.frame[result.frame["set"] == "control"]
    assert controls["delta"].tolist() == result.meta["control"]["deltas"]
    assert controls["heads"].tolist() == [",".join(s) for s in result.meta["control"]["sets"]]


def test_a_result_holds_a_frame_or_rows_of_a_known_kind():
    with pytest.raises(ValueError, match="unknown result kind"):
        Result("scores", pd.DataFrame())
    with pytest.raises(ValueError, match="exactly one"):
        Result("sweep", pd.DataFrame(), rows=[])


def test_a_circuits_edge_table_is_a_result_that_draws_its_largest_edges(small_model):
    from headlens.reports.inline import EDGE_ROWS

    edges = headlens.composition_scores(small_model, samples=8)
    assert edges.kind == "edges" and edges.meta["measure"] == "composition"
    assert (edges.frame["composition_baseline"] == edges.meta["baseline_mean"]).all()
    html = headlens.view(edges).html()
    assert 'data-kind="edges"' in html and html.count("<tr") == 1 + min(EDGE_ROWS, len(edges))


def test_further_tables_travel_with_the_frame_through_json_equality_and_concat():
    frame = pd.DataFrame({"head": ["0.0", "0.1"], "value": [1.0, math.nan]})
    edges = pd.DataFrame({"sender": ["0.0"], "receiver": ["1.0"], "effect": [0.5]})
    result = Result("circuit", frame, {"task": "t"}, tables={"edges": edges})
    assert "tables['edges']: 1 rows" in repr(result)
    document = json.loads(result.to_json())
    assert set(document) == {"kind", "meta", "rows", "tables"} and document["rows"][1]["value"] is None
    assert document["tables"] == {"edges": [{"sender": "0.0", "receiver": "1.0", "effect": 0.5}]}
    other = Result("circuit", frame.copy(), {"task": "t"}, tables={"edges": edges.assign(effect=0.25)})
    assert result == Result("circuit", frame.copy(), {"task": "t"}, tables={"edges": edges.copy()})
    assert result != other and result != Result("circuit", frame.copy(), {"task": "t"})
    joined = concat_results([result, other])
    assert joined.frame["head"].tolist() == ["0.0", "0.1", "0.0", "0.1"]
    assert joined.tables["edges"]["effect"].tolist() == [0.5, 0.25]
    with pytest.raises(ValueError, match="different further tables"):
        concat_results([result, Result("circuit", frame, {"task": "t"})])


def test_circuit_and_self_repair_are_results_that_draw_inline(small_model):
    from headlens.circuits.circuit import HEAD_COLUMNS, to_document
    from headlens.circuits.selfrepair import COMPENSATION_COLUMNS
    from headlens.circuits.tasks import induction_task
    from headlens.heads import Head

    task = induction_task(small_model, n=4, seq_len=12)
    ablated = [Head(1, 0), Head(1, 2)]
    found = headlens.circuit(small_model, task, {Head(0, 1): ["previous_token"]}, ablate=ablated)
    repair = headlens.self_repair(small_model, task, ablated)
    assert found.kind == "circuit" and repair.kind == "self_repair"
    assert list(found.frame.columns) == HEAD_COLUMNS and len(found.frame) == 8
    assert list(repair.frame.columns) == COMPENSATION_COLUMNS and len(repair.frame) == 8 - len(ablated)
    # the circuit's self-repair is self_repair's own: the same table and figures by two routes
    assert found.tables["compensation"].equals(repair.frame) and found.meta["self_repair"] == repair.meta
    assert found.meta["self_repair"]["ablated"] == ["1.0", "1.2"]
    assert json.loads(found.to_json())["meta"] == found.meta  # JSON-ready
    document = to_document(found)
    assert [h["head"] for h in document["heads"]] == found.frame["head"].tolist()
    assert len(document["edges"]) == len(found.tables["edges"])
    assert [c["head"] for c in document["self_repair"]["compensation"]] == repair.frame["head"].tolist()
    for result, kind in ((found, "circuit"), (repair, "self_repair")):
        for lang in ("en", "es"):
            html = headlens.view(result, lang=lang).html()
            assert f'data-kind="{kind}"' in html and "<script src" not in html
    assert "1.0, 1.2" in headlens.view(repair).html()  # the sentence names the ablated set
