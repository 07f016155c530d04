"""Discovery holds one graph task's reference runs at a time (headlens.circuits.resampled.template_scores):
the two template sets of the stability figure are scored, each on its own GraphTask, before the task's own
GraphTask is built, so no GraphTask is alive while another is built; the template Jaccard is still that of
the top-k edges of each template set's scores, computed here on graph tasks built afresh."""

from __future__ import annotations

import weakref

import pytest

import headlens.circuits.discover as discover_module
import headlens.circuits.resampled as resampled_module
from headlens.circuits.discover import discover, jaccard, select
from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.tasks import induction_task


@pytest.fixture(scope="module")
def tiny():
    from headlens.load.models import load_model

    return load_model("tiny")


def test_no_graph_task_is_built_while_another_is_alive_and_the_template_overlap_is_its_definition(tiny, monkeypatch):
    live: weakref.WeakSet = weakref.WeakSet()
    alive_at_build: list[int] = []

    class Tracked(GraphTask):
        def __init__(self, *args, **kwargs):
            alive_at_build.append(len(live))
            super().__init__(*args, **kwargs)
            live.add(self)

    for module in (discover_module, resampled_module):  # discover builds the task's, resampled the templates'
        monkeypatch.setattr(module, "GraphTask", Tracked)
    task = induction_task(tiny, n=3, seq_len=6, seed=0)
    pair = [induction_task(tiny, n=3, seq_len=6, seed=s) for s in (5, 6)]
    result = discover(tiny, task, "eap-ig", edges=10, steps=2, variants=pair)
    assert alive_at_build == [0, 0, 0]  # two template sets, then the task: each built with no other alive
    monkeypatch.undo()
    tops = []
    for variant in pair:
        gt = GraphTask(tiny, variant)
        tops.append(select(gt, gt.scores("eap-ig", 2), 10, "top"))
    assert result.meta["stability"]["jaccard_templates"] == jaccard(*tops)
