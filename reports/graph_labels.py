"""Edge labels of the circuit graphs (reports/circuits.py) that a reader can read: at EDGE_LABEL_PT on a white
box, the strongest LABELLED_EDGES edges only, each at the first spot along its edge (SPOTS) where its box
overlaps no label already placed, no node and not the legend; an edge without a free spot stays unlabelled.
Every drawn edge, labelled or not, is listed with its weight in the table under the graph (`edge_table`)."""

from __future__ import annotations

import math

import networkx as nx
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.transforms import Bbox

from headlens.reports.figures import plain_text
from headlens.reports.i18n import quantity, t

EDGE_LABEL_PT = 9  # edge labels' font size in points (the node names are 8 pt)
LABELLED_EDGES = 6  # the strongest edges (by |weight|) that get a label on the graph
SPOTS = (0.5, 0.35, 0.65, 0.25, 0.75)  # where along an edge (0: sender, 1: receiver) a label may sit, in turn


def edge_word(kind: str, lang: str) -> str:
    """An edge's label word: its input (Q, K, V) or, for a direct or backup edge, the catalogue's word."""
    return kind.upper() if kind in ("q", "k", "v") else t(f"circuits.edge.{kind}", lang)


def edge_text(kind: str, weight: float, lang: str) -> str:
    """ "K +0.32": the edge's input and its signed weight as the page writes a quantity."""
    return f"{edge_word(kind, lang)} {'+' if weight >= 0 else ''}{quantity(weight, lang)}"


def node_boxes(ax: Axes, pos: dict, node_size: float) -> list[Bbox]:
    """Each node's square in display pixels (a networkx node of `node_size` points² has that area)."""
    half = math.sqrt(node_size) / 2 * ax.figure.dpi / 72  # pixels
    centres = [ax.transData.transform(xy) for xy in pos.values()]
    return [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in centres]


def place_edge_labels(ax: Axes, graph: nx.DiGraph, pos: dict, lang: str, node_size: float) -> list:
    """Label the strongest edges where they overlap nothing (module docstring); the figure's layout must be
    final (tight_layout done), as the boxes are measured in display pixels. Returns the Text artists."""
    renderer = ax.figure.canvas.get_renderer()
    taken = node_boxes(ax, pos, node_size)
    if ax.get_legend() is not None:
        taken.append(ax.get_legend().get_window_extent(renderer))
    placed = []
    edges = sorted(graph.edges(data=True), key=lambda edge: -abs(edge[2]["weight"]))[:LABELLED_EDGES]
    for sender, receiver, data in edges:
        (x0, y0), (x1, y1) = pos[sender], pos[receiver]
        for spot in SPOTS:
            label = ax.text(
                x0 + spot * (x1 - x0),
                y0 + spot * (y1 - y0),
                plain_text(edge_text(data["kind"], data["weight"], lang)),
                fontsize=EDGE_LABEL_PT,
                ha="center",
                va="center",
                zorder=4,
                gid="edge-label",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.9},
            )
            box = label.get_window_extent(renderer).expanded(1.05, 1.1)
            if not any(box.overlaps(other) for other in taken):
                taken.append(box)
                placed.append(label)
                break
            label.remove()
    return placed


def edge_table(graph: nx.DiGraph, lang: str) -> pd.DataFrame:
    """Every edge the graph draws, strongest first: sender, receiver, input (edge word) and weight."""
    rows = [
        (sender, receiver, edge_word(data["kind"], lang), data["weight"])
        for sender, receiver, data in sorted(graph.edges(data=True), key=lambda edge: -abs(edge[2]["weight"]))
    ]
    return pd.DataFrame(rows, columns=["sender", "receiver", "via", "weight"])
