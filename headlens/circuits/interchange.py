"""Circuits as the JSON graph the EAP-IG package and the MIB leaderboard read and write.

The format of hannamw/EAP-IG's `Graph.to_json` / `Graph.from_json` (src/eap/graph.py):
{"cfg": {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"},
 "nodes": {"input": {"in_graph": bool}, "a0.h1": {...}, "m0": {...}, ..., "logits": {...}},
 "edges": {"a0.h1->a2.h3<k>": {"score": float, "in_graph": bool}, "m0->logits": {...}, ...}}
Node and edge names as headlens.circuits.graph names them. `write_graph` writes every edge of the
graph; `read_graph` reads such a file back as (circuit [senders, receivers] bool, scores), checking
that it describes this model's graph.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headlens.circuits.graph import LOGITS, ModelGraph, nodes_in
from headlens.errors import ConfigError, InputTextError
from headlens.files import read_json, write_atomic


def graph_document(graph: ModelGraph, scores: torch.Tensor, keep: torch.Tensor, d_model: int) -> dict:
    """The EAP-IG JSON document of circuit `keep` with edge `scores` (both [senders, receivers])."""
    present = set(nodes_in(graph, keep))
    cfg = {
        "n_layers": graph.n_layers,
        "n_heads": graph.n_heads,
        "parallel_attn_mlp": graph.parallel,
        "d_model": d_model,
    }
    nodes = {name: {"in_graph": name in present} for name in [*graph.sender_names, LOGITS]}
    edges = {
        graph.edge_name(s, r): {"score": float(scores[s, r]), "in_graph": bool(keep[s, r])}
        for s, r in graph.real.nonzero().tolist()
    }
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def write_graph(path, graph: ModelGraph, scores: torch.Tensor, keep: torch.Tensor, d_model: int) -> None:
    write_atomic(path, json.dumps(graph_document(graph, scores, keep, d_model)))


def read_graph(path, graph: ModelGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """(circuit, scores) [senders, receivers] of an EAP-IG JSON file; edges it leaves out are out of
    the circuit with score 0. InputTextError for a file that is not such a document, ConfigError for
    one of another model."""
    path = Path(path)
    doc = read_json(path, "--circuit", InputTextError)  # a regular file under the cap, then parse_json's checks
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), dict) for k in ("cfg", "edges")):
        raise InputTextError(f"{path}: expected an EAP-IG graph with 'cfg' and 'edges' objects")
    cfg = doc["cfg"]
    shape = (cfg.get("n_layers"), cfg.get("n_heads"))
    if shape != (graph.n_layers, graph.n_heads):
        raise ConfigError(
            f"{path} is the graph of a {shape[0]} x {shape[1]} model; this one has "
            f"{graph.n_layers} layers x {graph.n_heads} heads"
        )
    keep = torch.zeros(graph.real.shape, dtype=torch.bool)
    scores = torch.zeros(graph.real.shape, dtype=torch.float64)
    for name, info in doc["edges"].items():
        if not isinstance(info, dict) or not isinstance(info.get("in_graph", False), bool):
            raise InputTextError(f"{path}: edge {name!r} needs an object with a boolean 'in_graph'")
        s, r = graph.parse_edge(name)
        keep[s, r] = info.get("in_graph", False)
        score = info.get("score", 0.0)
        scores[s, r] = float(score) if isinstance(score, (int, float)) and abs(score) < 1e300 else float("nan")
    return keep, scores
