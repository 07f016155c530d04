"""How sure each label is (headlens.classify.stability): planted heads keep their labels in every bootstrap
resample and no other head earns one in any; a head whose score sits at its cut-off is borderline; the
intervals equal a percentile bootstrap computed here with numpy from the probes' own per-unit sums."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from headlens.classify import ClassifyConfig, classify_heads, kinds
from headlens.classify.runs import SOURCE_DEFAULT, ProbeRun, probe_sizes, resolve_text
from headlens.classify.stability import N_RESAMPLES, STABLE_MIN, add_columns
from headlens.load.models import load_model
from tests.helpers.planted import D_HEAD, EXPECTED_LABELS, N_HEADS, N_LAYERS, PLANTED_TEXT, build_planted

PLANTED = ClassifyConfig(n_seq=4, seed=0, needles=False)
STABILITY = [f"{kind.label}_stability" for kind in kinds.KINDS]


def _row(frame, layer, head):
    return frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]


@pytest.mark.slow
def test_planted_labels_keep_stability_one_and_no_other_head_earns_a_label_in_any_resample():
    planted = build_planted(0)
    frame = classify_heads(planted.loaded, text=PLANTED_TEXT, config=PLANTED).frame
    slots = {slot: role for role, slot in planted.positions.items()}
    for layer in range(N_LAYERS):
        for head in range(N_HEADS):
            row = _row(frame, layer, head)
            role = slots.get((layer, head))
            expected = [label for label in EXPECTED_LABELS.get(role, []) if label != "retrieval"]  # needles off
            assert row["labels"] == expected and row["borderline"] == [], (layer, head)
            for label in kinds.LABELS:
                assert row[f"{label}_stability"] == (1.0 if label in expected else 0.0), (layer, head, label)


def _weakened_duplicate_head(seed: int, scale: float):
    """The planted model with its duplicate-token head's queries scaled by `scale`: its attention on earlier
    copies falls from ~1 to a share that differs from sequence to sequence."""
    planted = build_planted(seed)
    layer, head = planted.positions["duplicate_token"]
    weight = planted.loaded.model.transformer.h[layer].attn.c_attn.weight  # [d_model, q|k|v]
    with torch.no_grad():
        weight[:, head * D_HEAD : (head + 1) * D_HEAD] *= scale
    return planted.loaded, (layer, head)


@pytest.mark.slow
def test_a_head_at_its_cut_off_is_borderline_and_strict_drops_it():
    loaded, (layer, head) = _weakened_duplicate_head(0, 0.1)
    config = dataclasses.replace(PLANTED, resamples=0)
    score = float(
        _row(classify_heads(loaded, text=PLANTED_TEXT, config=config).frame, layer, head)["duplicate_token_score"]
    )
    assert 0.05 < score < 0.95  # a share with room on both sides
    at_cut = dataclasses.replace(PLANTED, duplicate_token_min=score)
    row = _row(classify_heads(loaded, text=PLANTED_TEXT, config=at_cut).frame, layer, head)
    assert "duplicate_token" in row["labels"]  # >= its cut-off: labelled
    assert row["duplicate_token_score_lo"] < score < row["duplicate_token_score_hi"]
    assert row["duplicate_token_stability"] < STABLE_MIN and row["borderline"] == ["duplicate_token"]
    strict = dataclasses.replace(at_cut, strict=True)
    row = _row(classify_heads(loaded, text=PLANTED_TEXT, config=strict).frame, layer, head)
    assert "duplicate_token" not in row["labels"] and row["borderline"] == ["duplicate_token"]


def _numpy_interval(num, den, seed, probe):
    """The percentile bootstrap of sum(num) / sum(den) over units, drawn as the stability module documents."""
    n_units = len(num)
    picks = np.random.default_rng([seed, probe]).integers(0, n_units, size=(N_RESAMPLES, n_units))
    estimates = num[picks].sum(1) / den[picks].sum(1)  # [resample, layer, head]
    return np.percentile(estimates, [2.5, 97.5], axis=0)


@pytest.fixture(scope="module")
def tiny_runs():
    loaded = load_model("tiny")
    config = ClassifyConfig(seed=3)
    run = ProbeRun(loaded, config, [resolve_text(None)], SOURCE_DEFAULT, probe_sizes(loaded.spec.n_ctx, config))
    results = {name: kinds.PROBES[name].run(run) for name in ("text", "repeats", "needles")}
    return loaded, config, results


def test_intervals_equal_a_numpy_bootstrap_of_the_per_unit_scores(tiny_runs):
    loaded, config, results = tiny_runs
    frame = classify_heads(loaded, config=config).frame
    order = list(kinds.PROBES)
    checks = [("repeats", "prefix_matching_score"), ("repeats", "copying_score"), ("text", "first_token_score")]
    for probe, column in checks:
        num, den = results[probe].units.ratios[column]  # [unit, layer, head], [unit, layer, 1]
        np.testing.assert_allclose(  # the per-unit sums give back the score
            (num.sum(0) / den.sum(0)).ravel(), frame[column].to_numpy(), rtol=1e-5, atol=1e-6
        )
        low, high = _numpy_interval(num, den, config.seed, order.index(probe))
        np.testing.assert_allclose(frame[f"{column}_lo"], low.ravel(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(frame[f"{column}_hi"], high.ravel(), rtol=1e-5, atol=1e-6)
    per_test = results["needles"].units.ratios["retrieval_score"][0]  # [test, layer, head]
    picks = np.random.default_rng([config.seed, order.index("needles")]).integers(
        0, len(per_test), size=(N_RESAMPLES, len(per_test))
    )
    low, high = np.percentile(per_test[picks].mean(1), [2.5, 97.5], axis=0)
    np.testing.assert_allclose(frame["retrieval_score_lo"], low.ravel(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(frame["retrieval_score_hi"], high.ravel(), rtol=1e-5, atol=1e-6)


def test_the_same_seed_gives_the_same_intervals_and_stabilities(tiny_runs):
    loaded, config, results = tiny_runs
    frame = classify_heads(loaded, config=dataclasses.replace(config, resamples=0)).frame
    units = {name: result.units for name, result in results.items()}
    first, second = frame.copy(), frame.copy()
    add_columns(first, units, config)
    add_columns(second, units, config)
    assert first.equals(second)
    other = frame.copy()
    add_columns(other, units, dataclasses.replace(config, seed=config.seed + 1))
    assert not np.array_equal(other["prefix_matching_score_lo"], first["prefix_matching_score_lo"])
    for column in STABILITY:
        assert first[column].between(0.0, 1.0).all()
    for labels, row in zip(first["labels"], first.to_dict("records"), strict=True):
        assert row["borderline"] == [label for label in labels if row[f"{label}_stability"] < STABLE_MIN]


def test_every_cut_off_names_its_origin():
    for th in kinds.THRESHOLDS:
        assert th.origin in kinds.ORIGINS, th.name
        if th.origin == "paper":
            assert " et al. " in th.note, th.name  # the paper it comes from


def test_each_rule_labels_arrays_as_it_labels_each_head():
    """The rules read arrays of resampled scores elementwise: the same labels as one head's scalars."""
    rng = np.random.default_rng(0)
    config = ClassifyConfig()
    scores = {s.column: rng.uniform(-1.0, 1.0, 64) for s in kinds.SCORES}
    scores["positional_share"] = rng.uniform(0.8, 1.0, 64)
    scores["positional_offset"] = rng.integers(-2, 1, 64).astype(float)
    scores["retrieval_score"][::7] = np.nan  # NaN earns nothing
    for kind in kinds.KINDS:
        together = np.asarray(kind.rule(scores, config))
        one_by_one = [bool(kind.rule({k: float(v[i]) for k, v in scores.items()}, config)) for i in range(64)]
        assert together.tolist() == one_by_one, kind.label
