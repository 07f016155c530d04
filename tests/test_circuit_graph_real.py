"""Circuits found on SmolLM2-135M's whole graph (123,211 edges: into every head's q, k and v
inputs, every MLP and the logits): EAP scores, then the smallest top-k circuit whose faithfulness (MIB's,
counterfactual patching outside the circuit) reaches 0.8. It must reach it with a small share of the
graph's edges: the whole graph reaches f = 1 by construction, so the size bound is what makes the test
able to fail, and the search stops at the bound. IOI is measured against two counterfactuals: Wang et
al.'s ABC run (the task's default, strict xfail) and MIB's default IOI counterfactual, the subject's
second mention replaced by the indirect object (hannamw/MIB-circuit-track's `s2_io_flip_counterfactual`),
which must pass within the same bound."""

from __future__ import annotations

import pytest

from headlens.circuits.discover import Curve, log_grid
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.circuits.tasks import ioi_task

pytestmark = [pytest.mark.slow, pytest.mark.real]

SHARE = 0.05  # the circuit holds under 5% of the graph's edges


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


@pytest.mark.xfail(
    strict=True,
    reason="missed: EAP's circuits reach f >= 0.8, but only at <= 17,130 edges (13.9%) on IOI and <= 58,832 (47.7%) "
    "on induction (benchmarks/circuit_selection.py, BENCHMARKS.md), above SHARE",
)
@pytest.mark.parametrize("task_name", ["ioi", "induction"])
def test_smollm2_circuit_reaches_faithfulness_08_with_few_edges(smollm2, task_name):
    check_small_circuit(smollm2, circuit_task(smollm2, task_name))


def test_smollm2_ioi_circuit_with_mibs_counterfactual_reaches_faithfulness_08_with_few_edges(smollm2):
    check_small_circuit(smollm2, ioi_task(smollm2, counterfactual="s2-io-flip"))


def check_small_circuit(smollm2, task):
    """Some top-k EAP circuit with k <= SHARE of the edges reaches f >= 0.8: discover's search (its 12-point
    grid, then bisection below the first point that reaches the target) over the grid points up to SHARE
    and SHARE itself, so a circuit that needs more edges fails without the passes past the bound."""
    gt = GraphTask(smollm2, task)
    curve = Curve(gt, gt.scores("eap"))
    bound = int(SHARE * gt.graph.n_edges)
    grid = [k for k in log_grid(gt.graph.n_edges, 12) if k < bound] + [bound]
    k = curve.smallest(0.8, grid)
    tried = {size: round(f, 3) for size, (_, f) in sorted(curve.seen.items())}
    assert k is not None, f"no circuit of at most {bound} edges reaches f 0.8: k -> f {tried}"
    keep, f = curve.circuit(k)
    assert f >= 0.8 and int(keep.sum()) <= k <= bound, (k, int(keep.sum()), f)
    assert curve.full != curve.empty
