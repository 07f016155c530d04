"""Discovery's stability resamples scored in the task's own passes (headlens.circuits.resampled.scored,
GraphTask.scores' `draws`) against their definition: each bootstrap resample of the task's sequences made
into a task of its own (take_rows) and scored anew, its own reference run and gradient passes included.

EAP's and EAP-IG's score of an edge is a sum over the read positions of each sequence of terms that depend on
that sequence alone (its clean and counterfactual runs and the metric's gradient there), divided by the
number of read positions; so a resample's scores are each sequence's part weighted by how often it is drawn.
On `tiny` (float32, scores up to ~5 summed over ~10^4 terms: rounding ~1e-6), for a task whose sequences read
different numbers of positions and one whose prompts differ in length (padding), the two agree to 1e-5 and
give the same stability figures; most resamples differ from the task itself, so the weighting is exercised.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from headlens.circuits.discover import discover, select, stability
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.graph import prune
from headlens.circuits.moretasks import file_task
from headlens.circuits.resampled import resample_rows, scored
from headlens.circuits.tasks import induction_task, take_rows
from headlens.errors import ConfigError

ATOL = 1e-5
K = 12  # edges kept per circuit
PROMPTS = [("ab ab a", "b", "cd cd c"), ("xy z xy z x", "y", "pq r pq r p"), ("abc abc ab", "c", "def def de")]


@pytest.fixture(scope="module")
def tiny():
    from headlens.load.models import load_model

    return load_model("tiny")


def uneven_induction(tiny):
    """Induction on 5 sequences, the first reading 3 positions fewer than the others."""
    task = induction_task(tiny, n=5, seq_len=6, seed=2)
    where = task.where.clone()
    where[0, where[0].nonzero()[-3:, 0]] = False
    assert where.sum(1).unique().numel() == 2
    return dataclasses.replace(task, where=where)


def padded_file_task(tiny, tmp_path):
    """A user's task whose prompts have different lengths (right-padded)."""
    path = tmp_path / "task.jsonl"
    lines = [{"prompt": p, "answer": a, "counterfactual": c, "wrong": ["a", "z"]} for p, a, c in PROMPTS * 2]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    task = file_task(tiny, path)
    assert task.mask.sum(1).unique().numel() > 1
    return task


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
@pytest.mark.parametrize("which", ["uneven", "padded"])
def test_resamples_scored_in_the_tasks_passes_equal_each_resample_scored_anew(tiny, tmp_path, method, which):
    task = uneven_induction(tiny) if which == "uneven" else padded_file_task(tiny, tmp_path)
    gt = GraphTask(tiny, task, batch_tokens=30)  # several batches
    scores, shared = scored(gt, method, 3, seed=4)
    rows = resample_rows(task.tokens.shape[0], 4)
    anew = [GraphTask(tiny, take_rows(task, r)).scores(method, 3) for r in rows]
    assert torch.allclose(scores, gt.scores(method, 3), atol=ATOL, rtol=0)
    for got, want in zip(shared, anew, strict=True):
        assert torch.allclose(got, want, atol=ATOL, rtol=0), float((got - want).abs().max())
    differ = [float((want - scores).abs().max()) > 100 * ATOL for want in anew]
    assert sum(differ) >= 3, differ  # most resamples are not the task itself (a draw may be a permutation)
    keep = select(gt, scores, K, "top")
    assert stability(gt, K, keep, shared) == stability(gt, K, keep, anew)


def test_stability_figures_of_discover_are_those_of_the_resamples_scored_anew(tiny):
    task = uneven_induction(tiny)
    result = discover(tiny, task, "eap", edges=K, points=4)
    gt = GraphTask(tiny, task)
    keep = prune(gt.graph, select(gt, gt.scores("eap"), K, "top"))  # the circuit: pruned
    anew = [GraphTask(tiny, take_rows(task, r)).scores("eap") for r in resample_rows(task.tokens.shape[0], 0)]
    want = stability(gt, K, keep, anew)
    assert result.meta["stability"] == want
    assert 0.0 < want["jaccard_resamples"] < 1.0  # the resampled circuits differ, and overlap


def test_drawn_sequences_are_refused_where_their_scores_are_not_a_weighted_sum(tiny):
    task = induction_task(tiny, n=2, seq_len=4, seed=0)
    draws = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ConfigError, match="under patching only"):
        GraphTask(tiny, task, "mean").scores("eap", draws=draws)
    with pytest.raises(ConfigError, match="under patching only"):
        GraphTask(tiny, task).scores("exact", draws=draws)
