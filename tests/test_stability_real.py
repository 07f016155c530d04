"""SmolLM2's labels across seeds and texts: the agreement and the flipping heads `compare_labels` reports equal
the ones computed here from the two runs' label sets. (The figures themselves are not yet stated in
BENCHMARKS.md: the sitting that wrote these tests could not finish a SmolLM2 classify; see its section
"Labels that say how sure they are".)"""

from __future__ import annotations

import dataclasses

import pytest

from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify.compare import classify_texts, compare_labels, shipped_documents

pytestmark = [pytest.mark.slow, pytest.mark.real]


def _heads(result, label: str) -> set[tuple[int, int]]:
    frame = result.frame
    return {(r.layer, r.head) for r in frame.itertuples() if label in r.labels}


def _jaccard(sets) -> float:
    union = set().union(*sets)
    return len(set.intersection(*sets)) / len(union) if union else 1.0


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


def test_retrieval_heads_from_seed_to_seed(smollm2):
    config = ClassifyConfig()
    runs = {"seed0": classify_heads(smollm2, config=config)}
    runs["seed1"] = classify_heads(smollm2, config=dataclasses.replace(config, seed=1))
    sets = {name: _heads(result, "retrieval") for name, result in runs.items()}
    row = compare_labels(runs).set_index("role").loc["retrieval"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    assert row["flips"] == [f"{layer}.{head}" for layer, head in sorted(sets["seed0"] ^ sets["seed1"])]


def test_previous_token_heads_across_the_shipped_texts(smollm2):
    runs = classify_texts(smollm2, shipped_documents(), ClassifyConfig())
    sets = {name: _heads(result, "previous_token") for name, result in runs.items()}
    row = compare_labels(runs).set_index("role").loc["previous_token"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    flips = set().union(*sets.values()) - set.intersection(*sets.values())
    assert row["flips"] == [f"{layer}.{head}" for layer, head in sorted(flips)]
