"""Greedy edge selection (headlens.circuits.discover.greedy_order, EAP-IG's `Graph.apply_greedy`) against
the definition: grown from the logits, each step the largest-|score| edge into a node already in the circuit.
1. a hand-built 2-layer, 1-head graph where top-n and greedy differ, the order worked out by hand here;
2. random scores on a 3 x 2 graph: the order is a permutation of the real edges and every prefix reaches
   only nodes already in it (each edge's receiver is the logits or a sender of an earlier edge).
"""

from __future__ import annotations

import torch

from headlens.circuits.discover import greedy_order, select
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
    top = select(graph, scores, 2, "top")
    assert top[0, graph.head_receiver(0, 0, "q")] and not top[head0, graph.head_receiver(1, 0, "v")]


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
