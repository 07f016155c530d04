"""SmolLM2's labels across seeds and texts, stated and checked against figures computed here.

1. Retrieval from seed to seed (the needles and random tokens redrawn): the Jaccard overlap and the flipping
   heads `compare_labels` reports equal the ones computed here from the two runs' label sets, and every head
   the new seed flips was marked borderline (bootstrap stability below STABLE_MIN) on one of the two runs:
   the stability says which retrieval labels may not survive another draw of needles.
2. Previous-token heads across the shipped texts (English, Spanish, Python): the Jaccard and flips equal the
   ones computed here, and each flipping head's scores in `flip_scores` are its positional share (the
   role's ranking score) on each text, read here from the frames.
The figures (Jaccard, flips, stabilities) are written as JSON to $HEADLENS_REAL_FIGURES when set;
BENCHMARKS.md quotes them ("Labels that say how sure they are").
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

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
def figures():
    found: dict = {}
    yield found
    if os.environ.get("HEADLENS_REAL_FIGURES"):
        Path(os.environ["HEADLENS_REAL_FIGURES"]).write_text(json.dumps(found, indent=1))


def test_retrieval_heads_from_seed_to_seed(smollm2, figures):
    config = ClassifyConfig()
    runs = {"seed0": classify_heads(smollm2, config=config)}
    runs["seed1"] = classify_heads(smollm2, config=dataclasses.replace(config, seed=1))
    sets = {name: _heads(result, "retrieval") for name, result in runs.items()}
    flips = sets["seed0"] ^ sets["seed1"]
    stabilities = {
        _named([head])[0]: [round(_stability(run, "retrieval", head), 4) for run in runs.values()] for head in flips
    }
    figures["retrieval_seeds"] = {
        "jaccard": _jaccard(sets.values()),
        "heads": {name: _named(heads) for name, heads in sets.items()},
        "flips_stability_seed0_seed1": stabilities,
    }
    row = compare_labels(runs).set_index("role").loc["retrieval"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    assert row["flips"] == _named(flips)
    unflagged = {head: s for head, s in stabilities.items() if min(s) >= STABLE_MIN}
    assert not unflagged, f"heads the seed flips that no run marked borderline: {unflagged}"


def test_previous_token_heads_across_the_shipped_texts(smollm2, figures):
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
    figures["previous_token_texts"] = {
        "jaccard": _jaccard(sets.values()),
        "heads": {name: _named(heads) for name, heads in sets.items()},
        "flip_positional_shares": scores,
    }
    row = compare_labels(runs).set_index("role").loc["previous_token"]
    assert row["jaccard"] == pytest.approx(_jaccard(sets.values()))
    assert row["flips"] == _named(flips)
    for text in row["flip_scores"]:
        head, _, rest = text.partition(" ")
        shown = [float(v) for v in rest.split(" ")[0].split("/")]
        assert shown == pytest.approx(scores[head], abs=5e-4)  # printed to 3 decimals
