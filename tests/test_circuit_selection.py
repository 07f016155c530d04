"""Greedy edge selection (headlens.circuits.discover.greedy_order, EAP-IG's `Graph.apply_greedy`) against
the definition: grown from the logits, each step the largest-|score| edge into a node already in the circuit.
1. a hand-built 2-layer, 1-head graph where top-n and greedy differ, the order worked out by hand here;
2. random scores on a 3 x 2 graph: the order is a permutation of the real edges and every prefix reaches
   only nodes already in it (each edge's receiver is the logits or a sender of an earlier edge).
3. "signed" selection (EAP-IG's absolute=False) on hand-set scores: the edges whose patching lowers a
   higher-is-better metric most come first, however large the opposite effects are; the other way round
   for a lower-is-better metric.
4. `Curve.bracket` on a faithfulness curve given here (a step at a known k, a dip after it): the bracket
   holds the step, is as narrow as asked, tol 0 gives the step itself (`smallest`), and where f dips
   back under the target bisection returns the crossing it found.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from headlens.circuits.discover import Curve, greedy_order, select
from headlens.circuits.graph import ModelGraph


def test_greedy_takes_an_edge_only_once_its_receiver_is_in_the_circuit():
    graph = ModelGraph(2, 1)
    scores = torch.zeros(graph.real.shape, dtype=torch.float64)
    head0, mlp0, head1 = graph.head_sender(0, 0), graph.mlp_sender(0), graph.head_sender(1, 0)
    scores[0, graph.head_receiver(0, 0, "q")] = 100.0  # largest, but a0.h0 is not in the circuit yet
    scores[head1, graph.logits_receiver] = -5.0
    scores[head0, graph.head_receiver(1, 0, "v")] = 3.0
    scores[mlp0, graph.logits_receiver] = 1.0
    order = [graph.edge_name(s, r) for s, r in greedy_order(graph, scores).tolist()]
    assert order[:4] == ["a1.h0->logits", "a0.h0->a1.h0<v>", "input->a0.h0<q>", "m0->logits"]
    top = select(_task_on(graph), scores, 2, "top")
    assert top[0, graph.head_receiver(0, 0, "q")] and not top[head0, graph.head_receiver(1, 0, "v")]


def _task_on(graph, higher_is_better: bool = True):
    """What select reads of a GraphTask: its graph and whether the task's metric is better higher."""
    return SimpleNamespace(graph=graph, task=SimpleNamespace(higher_is_better=higher_is_better))


def test_signed_selection_takes_the_edges_that_help_the_task_most():
    graph = ModelGraph(2, 1)
    scores = torch.zeros(graph.real.shape, dtype=torch.float64)
    head0, mlp0, head1 = graph.head_sender(0, 0), graph.mlp_sender(0), graph.head_sender(1, 0)
    helps = [(head1, graph.logits_receiver), (mlp0, graph.logits_receiver)]  # patching them lowers the metric
    hurts = (head0, graph.head_receiver(1, 0, "v"))  # patching it raises the metric, by the most of all
    scores[helps[0]], scores[helps[1]], scores[hurts] = -5.0, -1.0, 100.0
    chosen = select(_task_on(graph), scores, 2, "signed")
    assert {tuple(e) for e in chosen.nonzero().tolist()} == set(helps)
    assert select(_task_on(graph), scores, 2, "top")[hurts]  # by |score| it is first
    lower = select(_task_on(graph, higher_is_better=False), scores, 1, "signed")
    assert lower.nonzero().tolist() == [list(hurts)]


def test_every_greedy_prefix_is_connected_to_the_logits():
    graph = ModelGraph(3, 2)
    scores = torch.randn(graph.real.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    order = greedy_order(graph, scores * graph.real).tolist()
    assert len(order) == graph.n_edges and len({tuple(e) for e in order}) == graph.n_edges
    assert all(graph.real[s, r] for s, r in order)
    joined = {-1}  # the logits
    for s, r in order:
        assert int(graph.receiver_node[r]) in joined
        joined.add(s)


class _StepCurve(Curve):
    """A Curve whose f(k) is given: 0 below `step`, 1 from it on, except 0 again at k in `dips`."""

    def __init__(self, step: int, dips=()):
        self.step, self.dips, self.asked = step, set(dips), []

    def circuit(self, k: int):
        self.asked.append(k)
        return None, float(k >= self.step and k not in self.dips)


def test_bracket_holds_the_first_step_and_is_as_narrow_as_asked():
    grid = [1, 10, 100, 1000]
    assert _StepCurve(537).bracket(0.8, grid) == (536, 537)
    assert _StepCurve(537).smallest(0.8, grid) == 537
    for tol in (0.01, 0.05, 0.2):
        curve = _StepCurve(537)
        low, high = curve.bracket(0.8, grid, tol)
        assert low < 537 <= high and high - low <= max(1, tol * high)
        assert all(100 <= k <= 1000 for k in curve.asked[4:])  # bisection stays inside the grid interval
    assert _StepCurve(5000).bracket(0.8, grid) is None  # never reached
    # f not monotone: bisection's first probe (550) falls in a dip, so the bracket is the crossing above
    # the dip (a k with f(low) < target <= f(high), not the first such k: "the smallest k found")
    curve = _StepCurve(537, dips=range(540, 560))
    assert curve.bracket(0.8, grid) == (559, 560) and 550 in curve.asked
