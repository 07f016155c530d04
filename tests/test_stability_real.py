"""SmolLM2's labels across seeds and texts, stated and checked against figures computed here.

1. Retrieval from seed to seed (the needles and random tokens redrawn): the Jaccard overlap and the flipping
   heads `compare_labels` reports equal the ones computed here from the two runs' label sets. Whether every
   head the new seed flips was borderline (bootstrap stability below STABLE_MIN) on the run that labelled it
   is a strict xfail stating the measured miss: a head can gain a stable label on the next seed.
2. Previous-token heads across the shipped texts (English, Spanish, Python): the Jaccard and flips equal the
   ones computed here, and each flipping head's scores in `flip_scores` are its positional share (the
   role's ranking score) on each text, read here from the frames.
BENCHMARKS.md ("Labels that say how sure they are") states the figures these runs give.
"""

from __future__ import annotations

import dataclasses

import pytest

from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify.compare import classify_texts, compare_labels, shipped_documents
from headlens.classify.stability import STABLE_MIN

pytestmark = [pytest.mark.slow, pytest.mark.real]


def _heads(result, label: str) -> set[tuple[int, int]]:
    frame = result.frame
    return {(r.layer, r.head) for r in frame.itertuples() if label in r.labels}


def _jaccard(sets) -> float:
    union = set().union(*sets)
    return len(set.intersection(*sets)) / len(union) if union else 1.0


def _named(heads) -> list[str]:
    return [f"{layer}.{head}" for layer, head in sorted(heads)]


def _stability(result, label: str, head: tuple[int, int]) -> float:
    frame = result.frame
    row = frame[(frame["layer"] == head[0]) & (frame["head"] == head[1])].iloc[0]
    return float(row[f"{label}_stability"])


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


@pytest.fixture(scope="module")
def seed_runs(smollm2):
    config = ClassifyConfig()
    runs = {"seed0": classify_heads(smollm2, config=config)}
    runs["seed1"] = classify_heads(smollm2, config=dataclasses.replace(config, seed=1))
    return runs


def _seed_flips(runs) -> tuple[dict, set]:
    sets = {name: _heads(result, "retrieval") for name, result in runs.items()}
    return sets, sets["seed0"] ^ sets["seed1"]


def test_retrieval_heads_from_seed_to_seed(seed_runs):
    sets, flips = _seed_flips(seed_runs)
    row = compare_labels(seed_runs).set_index("role").loc["retrieval"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    assert row["flips"] == _named(flips)


@pytest.mark.xfail(
    strict=True,
    reason="measured 2026-12-06 (BENCHMARKS.md): 6 of the 7 retrieval heads the seed flips were borderline on the "
    "run that labelled them; 14.1 (0.097 at seed 0, 0.167 at seed 1) was stable at seed 1",
)
def test_every_retrieval_head_the_seed_flips_was_borderline_where_labelled(seed_runs):
    sets, flips = _seed_flips(seed_runs)
    unflagged = {}
    for head in flips:
        name = "seed0" if head in sets["seed0"] else "seed1"  # the run that labelled it
        stability = _stability(seed_runs[name], "retrieval", head)
        if stability >= STABLE_MIN:
            unflagged[_named([head])[0]] = (name, stability)
    assert not unflagged, f"heads the seed flips, stable where labelled: {unflagged}"


def test_previous_token_heads_across_the_shipped_texts(smollm2):
    runs = classify_texts(smollm2, shipped_documents(), ClassifyConfig())
    sets = {name: _heads(result, "previous_token") for name, result in runs.items()}
    flips = set().union(*sets.values()) - set.intersection(*sets.values())
    scores = {}
    for layer, head in sorted(flips):
        values = []
        for result in runs.values():
            frame = result.frame
            row = frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]
            values.append(float(row["positional_share"]))
        scores[f"{layer}.{head}"] = values
    row = compare_labels(runs).set_index("role").loc["previous_token"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    assert row["flips"] == _named(flips)
    for text in row["flip_scores"]:
        head, _, rest = text.partition(" ")
        shown = [float(v) for v in rest.split(" ")[0].split("/")]
        assert shown == pytest.approx(scores[head], abs=5e-4)  # printed to 3 decimals
