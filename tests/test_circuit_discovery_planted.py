"""Circuit discovery (headlens.circuits.discover) on a planted model whose circuit is known by construction.

The planted model (tests/helpers/planted_circuits.py: 4 layers x 3 heads, weights written, not trained)
does induction with five edges of the whole graph:
  input -> prev<v>   the previous-token head reads the previous token's TOK ...
  prev -> ind<k>     ... and writes it into PREV, which the induction head's keys read (K-composition)
  input -> ind<q>    the induction head's query reads the current token's TOK
  input -> ind<v>    its value reads the attended token's TOK
  ind -> logits      its OV writes that token into OUT, the only subspace the unembedding reads
and a decoy: a second previous-token head with the same pattern and OV map whose write lands in JUNK,
which no planted head reads.
The counterfactual is random tokens of the same length with no repeat, so the induction head finds no
earlier copy there and each of the five edges carries part of the loss difference. (With another repeated
sequence as counterfactual, the induction head attends the same positions in both runs, and a circuit
without its query and key edges keeps the behaviour: those edges are then not needed, by the definition
of faithfulness, whatever the mechanism.)
At the planted size (5 edges) discovery must return exactly these edges (precision and recall 1.0), with
faithfulness f >= 0.95, and no edge of the decoy: with exact patching, with EAP-IG and with discover's
default (no method named, which must be EAP-IG with 5 steps); EAP fails it (strict xfail, the reason
measured). The control: with the previous-token head's write into PREV removed (the planted circuit
broken), the same check fails.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headlens.circuits.discover import discover
from headlens.circuits.tasks import induction_task
from headlens.probes.inputs import random_token_range, repeated_random_tokens
from tests.helpers.planted import D_MODEL, N_HEADS, SUB
from tests.helpers.planted_circuits import build_planted_decoy, decoy_seeds

N_SEQ, SEQ_LEN = 2, 5  # 22 tokens: exact scoring (one pass per edge, 309 edges) stays cheap
PLANTED_SIZE = 5
MIN_F = 0.95
CURVE_POINTS = 6


def planted_edges(positions: dict) -> set[tuple[str, str, str]]:
    """The five edges of the planted induction circuit as (sender, receiver, via) in the graph's names."""
    prev, ind = ("a{}.h{}".format(*positions[role]) for role in ("previous_token", "induction"))
    return {
        ("input", prev, "v"),
        (prev, ind, "k"),
        ("input", ind, "q"),
        ("input", ind, "v"),
        (ind, "logits", "input"),
    }


def no_repeat_task(loaded):
    """Induction's clean sequences with a counterfactual of random tokens that never repeat (module docstring)."""
    task = induction_task(loaded, n=N_SEQ, seq_len=SEQ_LEN, seed=0)
    low, high = random_token_range(loaded.spec.d_vocab)
    other = repeated_random_tokens(N_SEQ, 2 * SEQ_LEN, 1, low, high, loaded.bos_token_id, seed=1)  # [n, pos]
    assert other.shape == task.tokens.shape
    return dataclasses.replace(task, corrupted=other)


def found(loaded, method: str | None):
    """The discovered circuit at the planted size: its (sender, receiver, via) edges, nodes and f. `method`
    None: discover's default (no method named)."""
    named = {} if method is None else {"method": method}
    task = no_repeat_task(loaded)
    result = discover(loaded, task, edges=PLANTED_SIZE, points=CURVE_POINTS, with_stability=False, **named)
    if method is None:
        assert (result.meta["method"], result.meta["steps"]) == ("eap-ig", 5)  # the default: EAP-IG, 5 steps
    edges = result.tables["edges"]
    inside = edges[edges["in_graph"]]
    got = set(zip(inside["sender"], inside["receiver"], inside["via"], strict=True))
    return got, set(result.frame["node"]), result.meta["faithfulness"]


@pytest.fixture(scope="module")
def planted():
    return build_planted_decoy(decoy_seeds(1)[0])


def check(planted, method: str | None) -> None:
    got, nodes, f = found(planted.loaded, method)
    truth = planted_edges(planted.positions)
    precision, recall = len(got & truth) / max(1, len(got)), len(got & truth) / len(truth)
    assert (precision, recall) == (1.0, 1.0), sorted(got)
    assert f >= MIN_F, f
    assert "a{}.h{}".format(*planted.positions["decoy"]) not in nodes


@pytest.mark.slow
@pytest.mark.parametrize("method", ["exact", "eap-ig", None])  # None: discover's default method
def test_discovery_finds_the_planted_circuit_and_leaves_the_decoy_out(planted, method):
    check(planted, method)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="EAP's first-order scores miss the planted circuit: the induction head's softmax is saturated "
    "(planted score 40), so its query and key edges score 2.2e-4 and 2.7e-4 (ranks 21 and 17; exact "
    "patching: 6.0 and 5.8), and LayerNorm's first-order term ranks the decoy's edges 3rd and 4th (-1.42 "
    "and -1.40; exact: -0.044 and -0.007). Its top 5 edges keep 3 after pruning, f = 0.18",
)
def test_eap_finds_the_planted_circuit(planted):
    check(planted, "eap")


@pytest.mark.slow
def test_the_check_fails_when_the_planted_circuit_is_broken():
    broken = build_planted_decoy(decoy_seeds(1)[0])
    layer, head = broken.positions["previous_token"]
    d_head = D_MODEL // N_HEADS
    c_proj = broken.loaded.model.transformer.h[layer].attn.c_proj
    with torch.no_grad():
        c_proj.weight[head * d_head : head * d_head + SUB] = 0.0  # its OV write into PREV: the keys read nothing
    with pytest.raises(AssertionError):
        check(broken, "eap-ig")
