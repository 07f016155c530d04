"""reports/circuits.py: the "How the heads work together" section from a circuit document written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from headlens.reports.circuits import circuit_graph, circuit_section, graph_uri, layout


def _doc(clean: float = 3.0) -> dict:
    heads = [
        {"head": "2.0", "labels": [], "direct_effect": 1.5, "total_effect": 0.4, "large_unlabelled": True},
        {
            "head": "1.1",
            "labels": ["name_mover"],
            "direct_effect": 0.8,
            "total_effect": None,
            "large_unlabelled": False,
        },
        {
            "head": "2.1",
            "labels": ["negative_name_mover"],
            "direct_effect": -0.5,
            "total_effect": None,
            "large_unlabelled": False,
        },
        {
            "head": "0.0",
            "labels": ["previous_token"],
            "direct_effect": 0.01,
            "total_effect": None,
            "large_unlabelled": False,
        },
    ]
    edges = [
        {"sender": "0.0", "receiver": "1.1", "via": "k", "composition": 0.12, "effect": -0.9, "attribution": None},
        {"sender": "0.0", "receiver": "1.1", "via": "q", "composition": 0.05, "effect": None, "attribution": None},
        {
            "sender": "1.1",
            "receiver": "logits",
            "via": "direct",
            "composition": None,
            "effect": 0.7,
            "attribution": None,
        },
    ]
    repair = {
        "ablated": ["1.1"],
        "method": "zero",
        "unit": "logits",
        "total_effect": -0.05,
        "direct_effect": 0.8,
        "direct_effect_ablated": 0.0,
        "compensation": [
            {"head": "2.1", "clean": -0.5, "ablated": 0.2, "change": 0.7},
            {"head": "2.0", "clean": 1.5, "ablated": 1.6, "change": 0.1},
            {"head": "0.0", "clean": 0.01, "ablated": -0.04, "change": -0.05},
        ],
    }
    task = {
        "name": "ioi",
        "description": "",
        "metric": "logit-diff",
        "unit": "logits",
        "clean": clean,
        "logit_metric": clean,
    }
    return {"task": task, "heads": heads, "edges": edges, "rest": {}, "large_share": 0.1, "self_repair": repair}


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_section_cites_the_evidence_lists_the_unlabelled_head_and_the_backups(lang):
    html = circuit_section([_doc()], lang)
    assert 'id="circuits"' in html and "data:image/png;base64," in html
    assert "2.0" in html.split("<table")[0]  # the unlabelled head is named before the table
    assert "0.0" in html and ("via K" in html or "vía K" in html)  # 1.1's feeder, by the K edge measured
    assert "2.1 (+0" in html and "2.0 (+0" in html  # the two heads that make up for 1.1
    assert "0.0 (-0" not in html  # a head that fell is no backup


def test_the_graph_draws_measured_edges_direct_paths_and_backups():
    graph = circuit_graph(_doc())
    assert graph.edges["0.0", "1.1"]["kind"] == "k"  # the q edge has no measured effect: not drawn
    assert graph.edges["2.0", "logits"]["weight"] == 1.5
    assert graph.edges["1.1", "2.1"]["kind"] == "backup" and graph.edges["1.1", "2.0"]["kind"] == "backup"
    assert graph.nodes["2.0"]["role"] == "unlabelled" and graph.nodes["1.1"]["role"] == "name_mover"


def test_the_drawing_does_not_depend_on_the_order_the_document_lists_heads_and_backups_in():
    doc, shuffled = _doc(), _doc()
    shuffled["heads"].reverse()  # four heads, fewer than GRAPH_HEADS: the same ones are drawn
    shuffled["self_repair"]["compensation"][:2] = shuffled["self_repair"]["compensation"][1::-1]
    graph = circuit_graph(shuffled)
    assert list(graph.nodes) == ["0.0", "1.1", "2.0", "2.1", "logits"]  # by layer, then head
    assert list(graph.edges) == list(circuit_graph(doc).edges)
    assert graph_uri(shuffled, "en") == graph_uri(doc, "en")


LAYOUT_CHECK = """
import json
from headlens.reports.circuits import circuit_graph, layout
heads = [{"head": f"3.{h}", "labels": [], "direct_effect": 0.1 * h, "total_effect": None,
          "large_unlabelled": False} for h in (4, 0, 6, 2, 5, 1)]
doc = {"heads": heads, "edges": [], "self_repair": None}
pos = layout(circuit_graph(doc))
print(json.dumps({node: [float(v) for v in xy] for node, xy in pos.items()}))
"""


def test_a_layers_heads_are_stacked_in_head_order_whatever_the_string_hashing():
    """Six heads of one layer laid out in two processes with different PYTHONHASHSEED: the same
    positions, stacked by head index (networkx groups by an attribute into sets, whose order is the
    hashing's: 1 chance in 720 of passing per process without the ordered columns)."""
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", LAYOUT_CHECK], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1]
    heads = [f"3.{h}" for h in range(7) if h != 3]
    ys = [runs[0][node][1] for node in heads]
    assert ys == sorted(ys) or ys == sorted(ys, reverse=True)  # monotone in the head index
    assert len(set(ys)) == len(ys)


def test_layout_is_one_column_per_layer():
    pos = layout(circuit_graph(_doc()))
    xs = {node: round(float(xy[0]), 9) for node, xy in pos.items()}
    assert xs["2.0"] == xs["2.1"] and len({xs["0.0"], xs["1.1"], xs["2.0"], xs["logits"]}) == 4


def test_no_ioi_circuit_is_drawn_where_the_model_does_not_do_the_task():
    html = circuit_section([_doc(clean=-0.2)], "en")
    assert "does not do the IOI task" in html and "data:image/png" not in html


def _crowded_doc() -> dict:
    """Eight heads over four layers into the logits and eight measured edges between them: more edges than
    LABELLED_EDGES, several sharing a node, as on a real model's graph."""
    doc = _doc()
    doc["heads"] = [
        {
            "head": f"{layer}.{head}",
            "labels": [],
            "direct_effect": 0.1 * (layer + 1) * (-1) ** head,
            "total_effect": None,
            "large_unlabelled": False,
        }
        for layer in range(4)
        for head in range(2)
    ]
    pairs = [("0.0", "1.0"), ("0.0", "1.1"), ("0.1", "1.0"), ("1.0", "2.0"), ("1.1", "2.1"), ("1.0", "3.0")]
    pairs += [("2.0", "3.1"), ("2.1", "3.0")]
    doc["edges"] = [
        {
            "sender": a,
            "receiver": b,
            "via": "kqv"[i % 3],
            "composition": 0.1,
            "effect": 0.9 - 0.1 * i,
            "attribution": None,
        }
        for i, (a, b) in enumerate(pairs)
    ]
    doc["self_repair"] = None
    return doc


@pytest.mark.parametrize("lang", ["en", "es"])
def test_edge_labels_are_legible_apart_and_on_the_strongest_edges(lang):
    """The labels drawn are at least 9 pt, on the strongest edges only, in the page's number style, and no
    label's box (measured on the drawn figure) overlaps another label, a node or the legend; every edge of
    the graph, labelled or not, is in the table under it."""
    from matplotlib.transforms import Bbox

    from headlens.reports.circuits import NODE_SIZE, graph_figure
    from headlens.reports.graph_labels import LABELLED_EDGES, edge_table, node_boxes
    from headlens.reports.i18n import quantity

    doc = _crowded_doc()
    graph = circuit_graph(doc)
    fig = graph_figure(doc, lang)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [text for text in ax.texts if text.get_gid() == "edge-label"]
    assert 3 <= len(labels) <= LABELLED_EDGES  # most of the strongest find a free spot
    strongest = sorted(graph.edges(data=True), key=lambda edge: -abs(edge[2]["weight"]))[:LABELLED_EDGES]
    words = {f"{d['kind'].upper() if d['kind'] in 'qkv' else ''} +{quantity(d['weight'], lang)}" for *_, d in strongest}
    boxes = []
    for text in labels:
        assert text.get_fontsize() >= 9
        shown = text.get_text()
        assert any(shown.endswith(word.strip()) for word in words), shown  # a strongest edge, as the page writes it
        boxes.append(text.get_window_extent(renderer))
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1 :])
        half = (NODE_SIZE**0.5) / 2 * fig.dpi / 72
        centres = [ax.transData.transform(xy) for xy in layout(graph).values()]
        nodes = [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in centres]
        assert not any(box.overlaps(node) for node in nodes)
    assert len(node_boxes(ax, layout(graph), NODE_SIZE)) == graph.number_of_nodes()
    table = edge_table(graph, lang)
    assert len(table) == graph.number_of_edges() and table["weight"].abs().is_monotonic_decreasing
