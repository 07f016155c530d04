"""Planted ground truth: classify_heads recovers every head role written into a hand-built GPT-2
(tests/helpers/planted.py) and labels no other head. Roles move with the seed."""

from __future__ import annotations

import pytest

from headlens.classify import ClassifyConfig, classify_heads
from tests.helpers.planted import EXPECTED_LABELS, N_HEADS, N_LAYERS, PLANTED_TEXT, build_planted

# The planted target gets e^PEAK_SCORE times the weight of any other key: its mass is 1 to ~1e-9,
# but the first queries of a window have fewer keys; 0.98 leaves room for those edge positions only.
PLANTED_MASS_MIN = 0.98
CONFIG = ClassifyConfig(n_seq=4, seed=0)
# The fast loop's planted-ground-truth check: one seed, two repeat sequences and no needle probe (so the
# induction head's label is induction alone); the slow tests cover three seeds with every probe.
FAST_CONFIG = ClassifyConfig(n_seq=2, seed=0, needles=False)


@pytest.fixture(scope="module", params=[0, 1, 2])
def planted_result(request):
    planted = build_planted(request.param)
    return planted, classify_heads(planted.loaded, text=PLANTED_TEXT, config=CONFIG)


def _labels(frame, layer, head):
    return frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]


def test_planted_roles_are_recovered_and_no_other_head_is_labelled():
    planted = build_planted(0)
    frame = classify_heads(planted.loaded, text=PLANTED_TEXT, config=FAST_CONFIG).frame
    expected = {
        planted.positions[role]: [name for name in labels if name != "retrieval"]
        for role, labels in EXPECTED_LABELS.items()
    }
    for layer in range(N_LAYERS):
        for head in range(N_HEADS):
            assert _labels(frame, layer, head)["labels"] == expected.get((layer, head), []), (layer, head)


@pytest.mark.slow
def test_every_planted_role_is_recovered(planted_result):
    planted, heads = planted_result
    frame = heads.frame
    for role, (layer, head) in planted.positions.items():
        assert _labels(frame, layer, head)["labels"] == EXPECTED_LABELS[role], (role, layer, head)


@pytest.mark.slow
def test_no_other_head_gets_a_label(planted_result):
    planted, heads = planted_result
    frame = heads.frame
    slots = set(planted.positions.values())
    others = [(layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS) if (layer, head) not in slots]
    assert len(others) == N_LAYERS * N_HEADS - len(slots)
    for layer, head in others:
        assert _labels(frame, layer, head)["labels"] == [], (layer, head)


@pytest.mark.slow
def test_planted_scores_match_the_construction(planted_result):
    planted, heads = planted_result
    frame = heads.frame
    pos = planted.positions
    assert _labels(frame, *pos["previous_token"])["prev_token_score"] > PLANTED_MASS_MIN
    assert _labels(frame, *pos["offset_2"])["positional_offset"] == -2
    assert _labels(frame, *pos["first_token"])["first_token_score"] > PLANTED_MASS_MIN
    assert _labels(frame, *pos["duplicate_token"])["duplicate_token_score"] > PLANTED_MASS_MIN
    induction = _labels(frame, *pos["induction"])
    assert induction["prefix_matching_score"] > PLANTED_MASS_MIN
    assert induction["copying_score"] > PLANTED_MASS_MIN  # OV writes exactly the attended token
    assert induction["retrieval_score"] > PLANTED_MASS_MIN  # it copies every needle token
    assert heads.meta["probes"]["n_needle_retrieved"] == heads.meta["probes"]["n_needle_tests"]


@pytest.mark.slow
def test_flipped_copy_is_anti_induction():
    """The same prefix-matching head writing minus the attended token is anti-induction, not induction."""
    planted = build_planted(3, copy_sign=-1.0)
    frame = classify_heads(planted.loaded, text=PLANTED_TEXT, config=CONFIG).frame
    row = _labels(frame, *planted.positions["induction"])
    assert row["labels"] == ["anti_induction"]
    assert row["copying_score"] < -PLANTED_MASS_MIN
    assert not any("induction" in labels for labels in frame["labels"] if labels != ["anti_induction"])
