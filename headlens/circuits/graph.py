"""The computational graph of a whole model, as the EAP-IG package and MIB lay it out.

Nodes (senders, in forward order): `input` (the embeddings), every attention head `a{L}.h{H}`
(query heads) and every MLP `m{L}`; `logits` receives only. A head receives through three inputs,
its query, key and value (`a{L}.h{H}<q>` ...), an MLP and the logits through one. An edge runs
from a sender to every later input it reaches through the residual stream: a head of layer L is
read by layer L's MLP and everything after (with a parallel residual, GPT-NeoX, layer L's MLP reads
only what layer L's attention reads). Edge names: `a0.h1->a2.h3<k>`, `m0->m2`, `a5.h1->logits`.

The layout (Hanna et al. 2024, hannamw/EAP-IG `eap/graph.py`, `Graph.from_model`): sender index
0 for `input`, 1 + L (H + 1) + h for head h of layer L, 1 + L (H + 1) + H for its MLP; receiver
index L (3H + 1) + i H + h for head h's input i (q 0, k 1, v 2), L (3H + 1) + 3H for the MLP and
the last for the logits. A circuit is a boolean matrix [senders, receivers] over the real edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from headlens.circuits.edges import VIAS
from headlens.errors import ConfigError

INPUT, LOGITS = "input", "logits"


@dataclass(frozen=True)
class ModelGraph:
    """The graph of a model with `n_layers` layers of `n_heads` query heads (module docstring)."""

    n_layers: int
    n_heads: int
    parallel: bool = False  # GPT-NeoX's parallel residual: layer L's MLP reads what its attention reads

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_receivers(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    def head_sender(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_sender(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def head_receiver(self, layer: int, head: int, via: str) -> int:
        return layer * (3 * self.n_heads + 1) + VIAS.index(via) * self.n_heads + head

    def mlp_receiver(self, layer: int) -> int:
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def logits_receiver(self) -> int:
        return self.n_receivers - 1

    def receiver_layer(self, receiver: int) -> int:
        """The layer whose block reads `receiver` (n_layers for the logits)."""
        return receiver // (3 * self.n_heads + 1)

    @cached_property
    def receiver_block(self) -> torch.Tensor:
        """[receivers] long: the block each receiver feeds, in forward order: layer L's attention 2L, its MLP
        2L + 1, the logits 2 n_layers."""
        index, width = torch.arange(self.n_receivers), 3 * self.n_heads + 1
        layer, rest = index // width, index % width  # [receivers] each
        return 2 * layer + (rest == 3 * self.n_heads).long()

    def upstream(self, receiver: int) -> int:
        """How many senders (a prefix in forward order) reach `receiver`."""
        if receiver == self.logits_receiver:
            return self.n_senders
        layer, rest = divmod(receiver, 3 * self.n_heads + 1)
        first = 1 + layer * (self.n_heads + 1)
        return first + self.n_heads if rest == 3 * self.n_heads and not self.parallel else first

    @cached_property
    def sender_names(self) -> list[str]:
        names = [INPUT]
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}" for h in range(self.n_heads)] + [f"m{layer}"]
        return names

    @cached_property
    def receiver_names(self) -> list[str]:
        """Each receiver as (node, via): via "q", "k", "v" for heads, "input" for MLPs and the logits."""
        names = []
        for layer in range(self.n_layers):
            names += [(f"a{layer}.h{h}", via) for via in VIAS for h in range(self.n_heads)]
            names.append((f"m{layer}", "input"))
        return [*names, (LOGITS, "input")]

    @cached_property
    def receiver_node(self) -> torch.Tensor:
        """[receivers] long: the sender index of each receiver's node (-1 for the logits)."""
        index = {name: i for i, name in enumerate(self.sender_names)}
        return torch.tensor([index.get(node, -1) for node, _ in self.receiver_names])

    @cached_property
    def real(self) -> torch.Tensor:
        """[senders, receivers] bool: True on the graph's edges."""
        limits = torch.tensor([self.upstream(r) for r in range(self.n_receivers)])  # [receivers]
        return torch.arange(self.n_senders)[:, None] < limits[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.real.sum())

    def edge_name(self, sender: int, receiver: int) -> str:
        node, via = self.receiver_names[receiver]
        return f"{self.sender_names[sender]}->{node}" + (f"<{via}>" if via in VIAS else "")

    def parse_edge(self, name: str) -> tuple[int, int]:
        """(sender, receiver) of an edge name; ConfigError for a name this graph has no edge of."""
        try:
            sender, rest = name.split("->")
            node, via = rest[:-1].split("<") if rest.endswith(">") else (rest, "input")
            s, r = self.sender_names.index(sender), self.receiver_names.index((node, via))
        except ValueError:
            raise ConfigError(f"edge {name!r} is not an edge of a {self.n_layers} x {self.n_heads} model") from None
        if not self.real[s, r]:
            raise ConfigError(f"edge {name!r} runs backwards: its sender comes after its receiver")
        return s, r


def graph_of(adapter) -> ModelGraph:
    """The graph of the model an adapter wraps."""
    return ModelGraph(adapter.n_layers, adapter.n_heads, adapter.parallel_residual)


def prune(graph: ModelGraph, keep: torch.Tensor) -> torch.Tensor:
    """`keep` [senders, receivers] without the edges of nodes on no path from `input` to `logits`
    (EAP-IG's `Graph.prune`: repeatedly drop nodes lacking an incoming or an outgoing edge)."""
    keep = keep & graph.real
    node_of = graph.receiver_node  # [receivers]
    while True:
        outgoing = keep.any(1)  # [senders]
        incoming = torch.zeros(graph.n_senders, dtype=torch.bool)
        fed = keep.any(0)  # [receivers]
        incoming[node_of[fed & (node_of >= 0)]] = True
        incoming[0] = True  # the input has no inputs
        alive = outgoing & incoming  # [senders]
        receiving = torch.cat([alive, torch.tensor([True])])[node_of]  # [receivers]; -1 -> the logits
        pruned = keep & alive[:, None] & receiving[None, :]
        if torch.equal(pruned, keep):
            return keep
        keep = pruned


def top_edges(graph: ModelGraph, scores: torch.Tensor, n: int) -> torch.Tensor:
    """The `n` real edges with the largest |score| (ties broken by forward order): [senders, receivers] bool."""
    flat = scores.abs().masked_fill(~graph.real, -1.0).flatten()  # [senders * receivers]
    order = torch.sort(flat, descending=True, stable=True).indices[: max(0, min(n, graph.n_edges))]
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[order] = True
    return keep.view(graph.n_senders, graph.n_receivers)


def nodes_in(graph: ModelGraph, keep: torch.Tensor) -> list[str]:
    """The sender nodes with an edge in `keep`, and `logits` if any edge reaches it."""
    senders = [graph.sender_names[i] for i in keep.any(1).nonzero().flatten().tolist()]
    return senders + ([LOGITS] if bool(keep[:, graph.logits_receiver].any()) else [])
