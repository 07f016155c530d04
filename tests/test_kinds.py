"""The registry of head kinds (headlens.classify.kinds): complete entries, and every stage reading from it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from headlens.classify import kinds
from headlens.classify.labels import THRESHOLDS, ClassifyConfig, ProbeConfig, absent_roles, label_head, rank_heads
from headlens.classify.runs import probe_sizes
from headlens.cli.commands_classify import TABLE_COLUMNS
from headlens.reports import explain
from headlens.reports.findings import absent_block, ioi_text
from headlens.results import Result

CATALOGUES = {
    lang: json.loads((Path(explain.__file__).parent / f"messages_{lang}.json").read_text(encoding="utf-8"))
    for lang in ("en", "es")
}


@pytest.mark.parametrize("lang", sorted(CATALOGUES))
def test_every_kind_and_score_has_its_catalogue_keys_in_both_languages(lang):
    catalogue = CATALOGUES[lang]
    for kind in kinds.KINDS:
        assert catalogue.get(kind.name_key) and catalogue.get(kind.what_key), (lang, kind.label)
        assert kind.citation and kind.colour.startswith("#")
    for column in {c for kind in kinds.KINDS for c in kind.evidence}:
        assert catalogue.get(f"short.{column}"), (lang, column)
    for score in kinds.SCORES:
        if score.heatmap:
            for part in ("title", "what", "source"):
                assert catalogue.get(f"score.{score.column}.{part}"), (lang, score.column, part)


def test_thresholds_are_config_fields_with_the_registry_defaults():
    names = {f.name for f in fields(ClassifyConfig)}
    config = ClassifyConfig()
    for th in kinds.THRESHOLDS:
        assert th.field in names and getattr(config, th.field) == th.default
        assert THRESHOLDS[th.name] == th.field and th.column in kinds.BY_COLUMN
    # the published values (REFERENCES.md): Voita 0.9, Gu 0.3, Wu 0.1
    assert (config.positional_min, config.first_token_min, config.retrieval_min) == (0.9, 0.3, 0.1)


def test_every_stage_reads_the_registry():
    assert TABLE_COLUMNS == kinds.TABLE_COLUMNS
    assert [info.column for info in explain.SCORES] == [s.column for s in kinds.SCORES if s.heatmap]
    assert explain.ROLE_EVIDENCE == {kind.label: kind.evidence for kind in kinds.KINDS}
    assert explain.CONFIG_FIELDS == {c: th.field for th in kinds.THRESHOLDS for c in (th.column, *th.also)}
    assert set(kinds.ROLES) | set(kinds.PROPERTIES) == set(kinds.LABELS)
    assert kinds.PROPERTIES == ("first_token",)


def test_label_head_applies_each_kinds_rule():
    row = {score.column: 0.0 for score in kinds.SCORES}
    row.update(
        positional_share=0.95, positional_offset=-1, first_token_score=0.5, prefix_matching_score=0.6, copying_score=0.7
    )
    config = ClassifyConfig()
    assert label_head(row, config) == [kind.label for kind in kinds.KINDS if kind.rule(row, config)]
    assert label_head(row, config) == ["previous_token", "positional", "first_token", "induction"]


def test_one_ranking_roles_first_then_sinks_then_the_rest():
    frame = pd.DataFrame(
        {
            "layer": [0, 0, 0, 1, 1],
            "head": [0, 1, 2, 0, 1],
            "labels": [["first_token"], [], ["first_token", "retrieval"], ["induction"], ["first_token"]],
            "first_token_score": [0.4, 0.1, 0.9, 0.2, 0.8],
            "retrieval_score": [0, 0, 0.3, 0, 0],
            "prefix_matching_score": [0, 0, 0, 0.7, 0],
        }
    )
    ranked = rank_heads(frame)
    # a role first (induction before retrieval in LABELS order), then the sinks strongest first, then none
    assert list(zip(ranked["layer"], ranked["head"], strict=True)) == [(1, 0), (0, 2), (1, 1), (0, 0), (0, 1)]


def test_probe_sizes_follow_the_budget_not_the_context():
    config = ClassifyConfig()
    long = probe_sizes(8192, config)
    assert (long["window"], long["needle_context"], long["capped"]) == (kinds.DEFAULT_TOKEN_BUDGET,) * 2 + (True,)
    assert probe_sizes(256, ClassifyConfig(token_budget=512)) == {
        "n_ctx": 256,
        "token_budget": 512,
        "window": 256,
        "repeat_context": 256,
        "needle_context": 256,
        "capped": False,
    }
    needles = probe_sizes(8192, ClassifyConfig(needle_budget=8192))  # long-context needles stay available
    assert (needles["window"], needles["needle_context"]) == (kinds.DEFAULT_TOKEN_BUDGET, 8192)


@pytest.mark.parametrize("lang", sorted(CATALOGUES))
def test_the_findings_say_the_models_own_ioi_logit_difference(lang):
    frame = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "ioi_logit_diff": [4.04, 4.04], "n_ioi_prompts": [48, 48]})
    text = ioi_text(Result("heads", frame, {"probes": {"ioi_correct_share": 0.75}}), lang)
    percent = "75%" if lang == "en" else "75\u00a0%"  # Spanish writes a (non-breaking) space before the sign
    assert ("4.04" if lang == "en" else "4,04") in text and "48" in text and percent in text
    without = Result("heads", frame.drop(columns="ioi_logit_diff"), {"probes": {"ioi_correct_share": 0.75}})
    assert ioi_text(without, lang) == ""  # a frame without the IOI probe
    missing = {"ioi_missing": "no single-token names"}  # a frame without the name counts
    assert "no single-token names" in ioi_text(Result("heads", frame, {"probes": missing}), lang)
    missing = {"ioi_missing": "the probe's English reason", "ioi_names": 1, "ioi_names_total": 40}
    text = ioi_text(Result("heads", frame, {"probes": missing}), lang)
    assert " 1 " in text and "40" in text and "English reason" not in text  # the reason in the page's language
    assert ("tokenizer" if lang == "en" else "tokenizador") in text


def _absent_frame():
    """Four heads: one induction head, the rest unlabelled; successor scores tie at the top, the
    name-mover scores are given, the syntactic probe scored nothing and no other score column exists."""
    frame = pd.DataFrame(
        {
            "layer": [1, 0, 0, 1],
            "head": [1, 0, 1, 0],
            "labels": [[], ["induction"], [], []],
            "prefix_matching_score": [0.1, 0.8, 0.2, 0.0],
            "copying_score": [0.0, 0.9, 0.1, 0.0],
            "successor_score": [0.3, 0.1, 0.3, 0.2],
            "io_attention": [0.1, 0.0, 0.6, 0.3],
            "s_attention": [0.1, 0.0, 0.2, 0.1],
            "name_copy_score": [0.0, 0.2, 0.1, 0.0],
            "name_negative_copy_score": [0.0, 0.0, 0.9, 0.0],
            "ioi_direct_effect": [0.0, 0.1, -0.5, 0.2],
            "syntactic_score": [float("nan")] * 4,
            "syntactic_accuracy": [float("nan")] * 4,
        }
    )
    return frame


ABSENT_META = {"config": {"successor_min": 0.4}}  # one cut-off given, the rest the registry's defaults


def test_absent_roles_name_the_highest_head_and_its_cut_offs():
    found = {a.label: a for a in absent_roles(_absent_frame(), ABSENT_META)}
    # induction is carried; anti-induction and prefix-matching read its columns and no head earned them
    assert "induction" not in found and {"anti_induction", "prefix_matching"} <= set(found)
    assert "retrieval" not in found and "copy_suppression" not in found  # their scores are not in the frame
    assert found["successor"].head == "0.1"  # 0.3 ties between 0.1 and 1.1: the first by (layer, head)
    assert found["successor"].values == (("successor_score", 0.3, 0.4),)  # the frame's own cut-off
    mover = found["name_mover"]
    assert mover.head == "0.1"  # highest END -> IO attention
    assert mover.values == (  # s_attention has no cut-off of its own: the rule asks END -> IO above it
        ("io_attention", 0.6, ClassifyConfig().io_attention_min),
        ("s_attention", 0.2, None),
        ("name_copy_score", 0.1, ClassifyConfig().name_copy_min),
        ("ioi_direct_effect", -0.5, None),
    )
    negative = dict((c, cut) for c, _, cut in found["negative_name_mover"].values)
    assert negative["name_negative_copy_score"] == ClassifyConfig().name_copy_min  # the negative movers' rule
    assert found["syntactic"].head is None and found["syntactic"].values == ()
    not_run = _absent_frame().assign(syntax_source=kinds.SOURCE_NOT_RUN)  # a probe not asked for says nothing
    assert "syntactic" not in {a.label for a in absent_roles(not_run, ABSENT_META)}
    assert list(found) == [label for label in kinds.ROLES if label in found]  # registry order
    assert absent_roles(_absent_frame().drop(columns="labels"), ABSENT_META) == []


@pytest.mark.parametrize("lang", sorted(CATALOGUES))
def test_the_findings_say_why_each_absent_role_is_absent(lang):
    html = absent_block(Result("heads", _absent_frame(), ABSENT_META), lang)
    assert CATALOGUES[lang]["role.successor"] in html.split("</summary>")[0]  # named on the folded block's line
    html = html[html.index("<ul>") :]  # each role's line
    successor = html[html.index(CATALOGUES[lang]["role.successor"]) :].split("</li>")[0]
    assert "<strong>0.1</strong>" in successor and ("0.30" if lang == "en" else "0,30") in successor
    assert ("0.4" if lang == "en" else "0,4") in successor  # the cut-off the frame was labelled with
    assert CATALOGUES[lang]["role.induction"] not in html
    syntactic = html[html.index(CATALOGUES[lang]["role.syntactic"]) :].split("</li>")[0]
    assert "<strong>" not in syntactic  # no head scored
    carried = ("successor", "name_mover", "negative_name_mover", "syntactic")
    every = _absent_frame().assign(labels=[[label] for label in carried])
    every = every.drop(columns=["prefix_matching_score"])
    assert absent_block(Result("heads", every, ABSENT_META), lang) == ""


def test_classify_notes_name_the_highest_head_of_each_absent_role(capsys):
    from headlens.cli.commands_classify import _kind_notes

    frame = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "labels": [[], []],
            "positional_share": [0.5, 0.7],
            "positional_offset": [-1, -3],
            "prev_token_score": [0.2, 0.1],
        }
    )
    _kind_notes(Result("heads", frame, {"probes": {}, "config": {"positional_min": 0.8}}))
    assert capsys.readouterr().err.splitlines() == [
        "headlens: note: no previous_token heads: highest positional_share at 0.1: positional_share 0.70 "
        "(cut-off 0.8), prev_token_score 0.10",
        "headlens: note: no current_token heads: highest positional_share at 0.1: positional_share 0.70 (cut-off 0.8)",
        "headlens: note: no positional heads: highest positional_share at 0.1: positional_share 0.70 (cut-off 0.8), "
        "positional_offset -3",  # an offset, printed as the integer it is
    ]


def test_classify_config_writes_out_one_field_per_registry_threshold():
    """ClassifyConfig's fields past ProbeConfig's are the registry's thresholds, in its order, with its defaults."""
    probe_fields = {f.name for f in fields(ProbeConfig)}
    written = [(f.name, f.default) for f in fields(ClassifyConfig) if f.name not in probe_fields]
    assert written == [(th.field, th.default) for th in kinds.THRESHOLDS]
