"""Circuit discovery on the whole model's graph: score every edge, keep the top ones, measure them.

`discover` scores every edge of the graph (headlens.circuits.graph) by exact patching, EAP or EAP-IG
(headlens.circuits.faithfulness), then:
- the faithfulness curve f(k) over a log-spaced grid of k edges (each circuit pruned to the nodes
  on a path from `input` to `logits`, as EAP-IG's `Graph.prune`), the k edges chosen by `selection`:
  "top", the k largest |score| (EAP-IG's `apply_topn`), "greedy", grown from the logits one
  edge at a time, each the largest |score| into a node already in the circuit (`apply_greedy`), or
  "signed", the k edges whose scores say they help the task most (`absolute=False`: an edge whose
  patching would raise the metric ranks last, however large its effect);
  CPR = area under f and CMD = area under |1 - f|, the x axis k / (all edges), trapezoids (MIB's `area_under_curve`,
  mech-interp-bench MIB-circuit-track scripts/print_results.py);
- the smallest k with f >= 0.8 and with f >= 0.9 (first grid point that reaches it, then bisection
  down to the previous grid point);
- the circuit: `edges` top edges, or the smallest k reaching `target`;
- stability: Jaccard overlap of the top-k edge sets scored on 5 bootstrap resamples of the task's
  sequences (mean over pairs, with the full set's), and on two sets of templates (headlens.circuits.
  variants), where the caller passes them. EAP and EAP-IG under patching score the resamples in the
  task's own passes (each sequence's part of a score weighted by how often it is drawn).
The Result (kind "circuit_graph"): frame = the circuit's nodes with their roles; tables "edges" (sender,
receiver, via, score, in_graph: every edge of the graph) and "curve" (k, edges, nodes, faithfulness).
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from headlens.circuits.faithfulness import DEFAULT_METHOD, DEFAULT_STEPS, GraphTask, faithfulness
from headlens.circuits.graph import INPUT, LOGITS, nodes_in, prune, top_edges
from headlens.circuits.resampled import scored, template_scores
from headlens.errors import ConfigError
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

CURVE_POINTS = 20
TARGETS = (0.8, 0.9)
SELECTIONS = ("top", "greedy", "signed")


def log_grid(n_edges: int, points: int = CURVE_POINTS) -> list[int]:
    """Distinct edge counts, log-spaced from 1 to n_edges (both included)."""
    grid = np.unique(np.round(np.logspace(0, np.log10(n_edges), points)).astype(int))
    return [int(k) for k in grid if 1 <= k <= n_edges]


def area(xs: list[float], ys: list[float]) -> float:
    """MIB's normalised area: x divided by its last value, trapezoid rule."""
    x = np.asarray(xs, dtype=float) / xs[-1]
    y = np.asarray(ys, dtype=float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def greedy_order(graph, scores: torch.Tensor) -> torch.Tensor:
    """Every real edge [n_edges, 2] (sender, receiver) in the order greedy selection adds them (EAP-IG's
    `Graph.apply_greedy`, MIB's greedy option): from the logits, repeatedly the largest-|score| edge into a
    node already in the circuit; a sender joins the circuit with its first edge, and its inputs become
    candidates. Edges into nodes never reached come last, by |score|."""
    size = scores.abs().masked_fill(~graph.real, -1.0)  # [senders, receivers]
    node_of = graph.receiver_node.tolist()  # [receivers]: the sender index of each receiver's node
    inputs_of: dict[int, list[int]] = {}
    for receiver, node in enumerate(node_of):
        inputs_of.setdefault(node, []).append(receiver)
    heap: list = []

    def open_node(node: int) -> None:  # node -1: the logits
        for r in inputs_of.get(node, []):
            for s in range(graph.upstream(r)):
                heapq.heappush(heap, (-float(size[s, r]), s * graph.n_receivers + r))

    open_node(-1)
    order, joined = [], set()
    while heap:
        _, flat = heapq.heappop(heap)
        s, r = divmod(flat, graph.n_receivers)
        order.append((s, r))
        if s not in joined:
            joined.add(s)
            open_node(s)
    taken = torch.zeros_like(graph.real)
    if order:
        taken[tuple(torch.tensor(order).T)] = True
    rest = (size.masked_fill(taken, -1.0)).flatten()
    tail = torch.sort(rest, descending=True, stable=True).indices[: graph.n_edges - len(order)]
    tail = torch.stack([tail // graph.n_receivers, tail % graph.n_receivers], 1)
    return torch.cat([torch.tensor(order, dtype=torch.long).view(-1, 2), tail])


def first_edges(graph, order: torch.Tensor, k: int) -> torch.Tensor:
    """The first k edges of `order` [n_edges, 2] as [senders, receivers] bool."""
    keep = torch.zeros_like(graph.real)
    first = order[:k]
    keep[first[:, 0], first[:, 1]] = True
    return keep


def select(gt: GraphTask, scores: torch.Tensor, k: int, selection: str) -> torch.Tensor:
    """k edges of `scores` by `selection` (SELECTIONS), before pruning: [senders, receivers] bool."""
    if selection == "greedy":
        return first_edges(gt.graph, greedy_order(gt.graph, scores), k)
    return top_edges(gt.graph, ranking(gt, scores, selection), k)


def ranking(gt: GraphTask, scores: torch.Tensor, selection: str) -> torch.Tensor:
    """What top_edges ranks by (the largest |value| first) for `selection`: `scores` itself, or for
    "signed" each real edge's benefit to the task (minus its score where a higher metric is better: a
    score is the metric's change when the edge is patched), shifted to be non-negative so that |value|
    keeps its order [senders, receivers]."""
    if selection != "signed":
        return scores
    benefit = -scores if gt.task.higher_is_better else scores  # [senders, receivers]
    return torch.where(gt.graph.real, benefit - benefit[gt.graph.real].min(), 0.0)


class Curve:
    """Faithfulness of the k-edge circuits of one score matrix (the top k by |score|, or the first k
    of `greedy_order`), each pruned and each k measured once."""

    def __init__(self, gt: GraphTask, scores: torch.Tensor, selection: str = "top"):
        if selection not in SELECTIONS:
            raise ConfigError(f"unknown selection {selection!r}: choose one of {', '.join(SELECTIONS)}")
        self.gt, self.scores, self.ranked = gt, scores, ranking(gt, scores, selection)
        self.order = greedy_order(gt.graph, scores) if selection == "greedy" else None
        self.full, self.empty = gt.ends()
        self.seen: dict[int, tuple[torch.Tensor, float]] = {}

    def chosen(self, k: int) -> torch.Tensor:
        """The k edges selected, before pruning: [senders, receivers] bool."""
        if self.order is None:
            return top_edges(self.gt.graph, self.ranked, k)
        return first_edges(self.gt.graph, self.order, k)

    def circuit(self, k: int) -> tuple[torch.Tensor, float]:
        if k not in self.seen:
            keep = prune(self.gt.graph, self.chosen(k))
            self.seen[k] = keep, faithfulness(self.gt.metric(keep), self.full, self.empty)
        return self.seen[k]

    def smallest(self, target: float, grid: list[int]) -> int | None:
        """The smallest k found with f >= target (None: not even the whole model)."""
        found = self.bracket(target, grid)
        return None if found is None else found[1]

    def bracket(self, target: float, grid: list[int], rel_tol: float = 0.0) -> tuple[int, int] | None:
        """(low, high): f(low) < target <= f(high), high the first grid point reaching target, then
        bisected down towards the previous grid point until high - low <= max(1, rel_tol * high)
        (rel_tol 0: high is the smallest such k found). None: not even the whole model."""
        previous = 0
        for k in grid:
            if self.circuit(k)[1] >= target:
                low, high = previous, k  # f(low) < target <= f(high)
                while high - low > max(1, rel_tol * high):
                    mid = (low + high) // 2
                    low, high = (low, mid) if self.circuit(mid)[1] >= target else (mid, high)
                return low, high
            previous = k
        return None


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def stability(gt: GraphTask, k, keep, resampled, templates=None, selection="top") -> dict:
    """Jaccard overlap of the top-k edges of the resamples' scores `resampled` (resampled.scored) (mean over all
    pairs of those and the full set's `keep`) and between the two template sets' scores `templates`
    (resampled.template_scores; or None)."""
    sets = [keep, *(select(gt, scores, k, selection) for scores in resampled)]
    pairs = [jaccard(a, b) for a, b in itertools.combinations(sets, 2)]
    out = {"resamples": len(resampled), "k": k, "jaccard_resamples": float(np.mean(pairs)), "jaccard_templates": None}
    if templates is not None:
        first, second = (select(gt, scores, k, selection) for scores in templates)
        out["jaccard_templates"] = jaccard(first, second)
    return out


def discover(
    loaded: LoadedModel,
    task,
    method: str = DEFAULT_METHOD,
    edges: int | None = None,
    target: float | None = None,
    ablation: str = "patching",
    steps: int = DEFAULT_STEPS,
    points: int = CURVE_POINTS,
    labels: dict | None = None,
    variants=None,
    seed: int = 0,
    with_stability: bool = True,
    selection: str = "top",
) -> Result:
    """The circuit of `task` on `loaded` (module docstring): `edges` top edges, or the smallest set
    reaching faithfulness `target` (default 0.8), chosen by `selection` ("top": the largest |score|;
    "greedy": greedy_order). `labels`: head "L.H" -> its labels (roles)."""
    if edges is not None and target is not None:
        raise ConfigError("give --edges or --target, not both")
    templates = template_scores(loaded, variants, method, ablation, steps) if with_stability else None
    gt = GraphTask(loaded, task, ablation)
    scores, resampled = scored(gt, method, steps, seed if with_stability else None)
    return measure(gt, scores, method, edges, target, points, labels, seed, steps, resampled, templates, selection)


def measure(
    gt,
    scores,
    method,
    edges,
    target,
    points,
    labels,
    seed,
    steps,
    resampled,
    templates,
    selection: str = "top",
):
    """Curve, sizes, chosen circuit and stability of one score matrix: the Result of `discover`. Stability
    from the resamples' scores `resampled` (resampled.scored), none when None, and the template sets' `templates`
    (resampled.template_scores)."""
    graph = gt.graph
    if edges is not None and not 1 <= edges <= graph.n_edges:
        raise ConfigError(f"--edges {edges}: this model's graph has 1 to {graph.n_edges} edges")
    curve = Curve(gt, scores, selection)
    grid = log_grid(graph.n_edges, points)
    rows = []
    for k in grid:
        keep, f = curve.circuit(k)
        rows.append({"k": k, "edges": int(keep.sum()), "nodes": len(nodes_in(graph, keep)), "faithfulness": f})
    sizes = {f"size_at_{t}": curve.smallest(t, grid) for t in TARGETS}
    if edges is None:
        goal = 0.8 if target is None else target
        edges = curve.smallest(goal, grid) or graph.n_edges
    keep, f = curve.circuit(edges)
    xs, fs = [r["k"] for r in rows], [r["faithfulness"] for r in rows]
    meta = {
        "task": gt.task.name,
        "description": gt.task.description,
        "method": method,
        "steps": steps if method == "eap-ig" else None,
        "ablation": gt.ablation,
        "selection": selection,
        "metric_full": curve.full,
        "metric_empty": curve.empty,
        "k": edges,
        "n_edges": int(keep.sum()),
        "n_nodes": len(nodes_in(graph, keep)),
        "graph_edges": graph.n_edges,
        "faithfulness": f,
        "cpr": area(xs, fs),
        "cmd": area(xs, [abs(1 - v) for v in fs]),
        **sizes,
        "stability": None,
        "seed": seed,
    }
    if resampled is not None:
        meta["stability"] = stability(gt, edges, keep, resampled, templates, selection)
    tables = {"edges": edge_table(graph, scores, keep), "curve": pd.DataFrame(rows)}
    return Result("circuit_graph", node_frame(graph, keep, labels or {}), meta, tables=tables)


def edge_table(graph, scores: torch.Tensor, keep: torch.Tensor) -> pd.DataFrame:
    """Every edge of the graph: sender, receiver, via (q, k, v or input), score, in_graph; by |score|."""
    s, r = graph.real.nonzero(as_tuple=True)
    frame = pd.DataFrame(
        {
            "sender": [graph.sender_names[i] for i in s.tolist()],
            "receiver": [graph.receiver_names[i][0] for i in r.tolist()],
            "via": [graph.receiver_names[i][1] for i in r.tolist()],
            "score": scores[s, r].numpy(),
            "in_graph": keep[s, r].numpy(),
        }
    )
    order = np.argsort(-np.abs(frame["score"].to_numpy()), kind="stable")
    return frame.iloc[order].reset_index(drop=True)


def node_frame(graph, keep: torch.Tensor, labels: dict) -> pd.DataFrame:
    """The circuit's nodes: node, kind (input, head, mlp, logits), layer, head, roles."""
    rows = []
    for name in nodes_in(graph, keep):
        if name in (INPUT, LOGITS):
            rows.append({"node": name, "kind": name, "layer": None, "head": None, "roles": []})
        elif name.startswith("m"):
            rows.append({"node": name, "kind": "mlp", "layer": int(name[1:]), "head": None, "roles": []})
        else:
            layer, head = (int(p[1:]) for p in name.split("."))
            rows.append(
                {"node": name, "kind": "head", "layer": layer, "head": head, "roles": labels.get(f"{layer}.{head}", [])}
            )
    return pd.DataFrame(rows, columns=["node", "kind", "layer", "head", "roles"])
