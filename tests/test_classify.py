"""classify_heads and `headlens classify`: config, labels, output formats, determinism, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from headlens.classify import SCORE_COLUMNS, SOURCE_COLUMNS, ClassifyConfig, classify_heads, kinds
from headlens.classify.labels import LABELS, config_with_thresholds, label_head, rank_heads
from headlens.cli.main import cli
from headlens.errors import ConfigError
from headlens.probes import inputs as probes
from tests.helpers.planted import PLANTED_TEXT

FAST = ClassifyConfig(n_seq=2, max_windows=2)


def _scores(**overrides) -> dict:
    base = {
        "positional_share": 0.1,
        "positional_offset": -3,
        "first_token_score": 0.1,
        "duplicate_token_score": 0.1,
        "prefix_matching_score": 0.1,
        "copying_score": 0.0,
        "retrieval_score": 0.0,
        "successor_score": 0.0,
        "cs_ov_score": 0.0,
        "cs_qk_score": 0.0,
        "predicted_attention": 0.0,
        "io_attention": 0.0,
        "s_attention": 0.0,
        "name_copy_score": 0.0,
        "name_negative_copy_score": 0.0,
        "rare_word_score": 0.0,
        "syntactic_score": 0.0,
    }
    return {**base, **overrides}


def test_labels_follow_the_published_rules():
    config = ClassifyConfig()
    assert label_head(_scores(), config) == []
    assert label_head(_scores(positional_share=0.95, positional_offset=-1), config) == ["previous_token", "positional"]
    assert label_head(_scores(positional_share=0.95, positional_offset=0), config) == ["current_token", "positional"]
    assert label_head(_scores(positional_share=0.89, positional_offset=-1), config) == []  # Voita: >= 0.9
    assert label_head(_scores(first_token_score=0.31), config) == ["first_token"]  # Gu: > 0.3
    assert label_head(_scores(first_token_score=0.3), config) == []
    # induction needs prefix matching AND copying; suppressing copies is anti-induction
    assert label_head(_scores(prefix_matching_score=0.8, copying_score=0.9), config) == ["induction"]
    assert label_head(_scores(prefix_matching_score=0.8, copying_score=-0.9), config) == ["anti_induction"]
    # prefix matching without direct-path copying: a prefix-matching head (Olsson et al. 2022)
    assert label_head(_scores(prefix_matching_score=0.8, copying_score=0.1), config) == ["prefix_matching"]
    assert label_head(_scores(prefix_matching_score=0.8, copying_score=-0.49), config) == ["prefix_matching"]
    assert label_head(_scores(prefix_matching_score=0.8, copying_score=float("nan")), config) == []
    assert label_head(_scores(prefix_matching_score=0.39, copying_score=0.1), config) == []
    assert label_head(_scores(retrieval_score=0.11), config) == ["retrieval"]  # Wu: > 0.1
    assert label_head(_scores(retrieval_score=float("nan")), config) == []
    assert label_head(_scores(rare_word_score=0.5), config) == ["rare_word"]  # ours: >= 0.5 (Voita's head: 0.66)
    assert label_head(_scores(syntactic_score=0.1), config) == ["syntactic"]  # Voita: >= 10 points over the baseline
    assert label_head(_scores(syntactic_score=0.09), config) == []
    both = label_head(_scores(prefix_matching_score=0.8, copying_score=0.9, retrieval_score=0.5), config)
    assert both == ["induction", "retrieval"]
    # copy suppression needs both weight criteria (McDougall et al. 2023): OV (negative copying) and QK
    # (attending to the predicted token); attention on predicted copies in text is evidence, never a gate
    assert label_head(_scores(cs_ov_score=0.5, cs_qk_score=0.5), config) == ["copy_suppression"]
    assert label_head(_scores(cs_ov_score=0.9, cs_qk_score=0.49, predicted_attention=0.9), config) == []
    assert label_head(_scores(cs_ov_score=0.49, cs_qk_score=0.9), config) == []
    # name movers attend END -> IO (more than to S) and copy the name; negative movers write it down
    mover = {"io_attention": 0.2, "s_attention": 0.1, "name_copy_score": 0.5}
    assert label_head(_scores(**mover), config) == ["name_mover"]
    assert label_head(_scores(**{**mover, "s_attention": 0.3}), config) == []  # IO must beat S
    negative = {**mover, "name_copy_score": 0.0, "name_negative_copy_score": 0.97}
    assert label_head(_scores(**negative), config) == ["negative_name_mover"]
    assert label_head(_scores(**{**negative, "io_attention": 0.19}), config) == []


def test_thresholds_are_settable_by_name():
    config = config_with_thresholds(ClassifyConfig(), ["retrieval=0.2", "positional_min=0.8"])
    assert config.retrieval_min == 0.2 and config.positional_min == 0.8
    assert label_head(_scores(retrieval_score=0.15), config) == []


def test_rank_heads_puts_labelled_heads_first_strongest_first(small_model):
    import pandas as pd

    frame = pd.DataFrame(
        {
            "layer": [0, 0, 1],
            "head": [0, 1, 0],
            "labels": [[], ["first_token"], ["first_token"]],
            "first_token_score": [0.9, 0.5, 0.7],
        }
    )
    ranked = rank_heads(frame)
    assert list(zip(ranked["layer"], ranked["head"], strict=True)) == [(1, 0), (0, 1), (0, 0)]


@pytest.fixture(scope="module")
def small_classification(small_model):
    return classify_heads(small_model, text=PLANTED_TEXT, config=FAST)


@pytest.fixture(scope="module")
def small_frame(small_classification):
    return small_classification.frame


def test_frame_is_long_form_sorted_with_every_column(small_frame, small_classification, small_model):
    spec = small_model.spec
    assert list(small_frame.columns[:3]) == ["layer", "head", "labels"]
    assert len(small_frame) == spec.n_layers * spec.n_heads
    assert list(zip(small_frame["layer"], small_frame["head"], strict=True)) == sorted(
        zip(small_frame["layer"], small_frame["head"], strict=True)
    )
    for column in SCORE_COLUMNS + ["n_positions", "n_repeat_positions", "prev_token_std", "prefix_matching_std"]:
        assert column in small_frame.columns
    assert all(set(labels) <= set(LABELS) for labels in small_frame["labels"])
    assert small_classification.meta["probes"]["n_positions"] == small_frame["n_positions"].iloc[0] > 0


def test_needle_counts_are_tests_run_and_tests_retrieved(small_frame, small_classification, small_model):
    spec = small_model.spec
    ids = small_model.tokenizer(PLANTED_TEXT, add_special_tokens=False)["input_ids"]
    expected = probes.needle_prompts(
        ids,
        spec.n_ctx,
        small_model.bos_token_id,
        probes.random_token_range(spec.d_vocab),
        needle_len=min(16, spec.n_ctx // 8),
        depths=probes.even_depths(FAST.needle_depths),
    )
    assert (small_frame["n_needle_tests"] == len(expected)).all()  # every test run, retrieved or not
    assert (small_frame["n_needle_retrieved"] <= small_frame["n_needle_tests"]).all()
    assert small_classification.meta["probes"]["n_needle_retrieved"] == small_frame["n_needle_retrieved"].iloc[0]


def test_sources_name_the_given_text_when_it_is_long_enough(small_frame, small_classification):
    assert small_classification.meta["sources"] == {
        "text": "given_text",
        "repeats": "random_tokens",
        "needles": "given_text",
        "copy_suppression": "given_text",
        "ioi": "ioi_templates",
        "syntactic": "not_run",
    }
    for probe, column in SOURCE_COLUMNS.items():
        assert (small_frame[column] == small_classification.meta["sources"][probe]).all()


@pytest.mark.slow
def test_a_two_token_text_is_scored_and_the_haystack_comes_from_the_shipped_text(small_model):
    text = "Hello world"
    assert len(small_model.tokenizer(text, add_special_tokens=False)["input_ids"]) == 2
    heads = classify_heads(small_model, text=text, config=FAST)
    frame = heads.frame
    assert heads.meta["probes"]["n_text_tokens"] == 2 and heads.meta["probes"]["n_windows"] == 1
    assert frame["n_positions"].iloc[0] > 0 and frame["prev_token_score"].notna().all()
    assert heads.meta["sources"] == {
        "text": "given_text",
        "repeats": "random_tokens",
        "needles": "default_text",
        "copy_suppression": "given_text",  # the given text's own tokens, too few for a counted position
        "ioi": "ioi_templates",
        "syntactic": "not_run",
    }
    assert frame["predicted_attention"].isna().all() and (frame["n_cs_positions"] == 0).all()
    assert (frame["needles_source"] == "default_text").all() and (frame["n_needle_tests"] > 0).all()
    off = classify_heads(small_model, text=text, config=ClassifyConfig(n_seq=2, max_windows=2, needles=False))
    assert off.meta["sources"]["needles"] == "not_run" and (off.frame["n_needle_tests"] == 0).all()


def test_classify_is_deterministic_under_a_seed(small_model, small_frame):
    again = classify_heads(small_model, text=PLANTED_TEXT, config=FAST).frame
    assert again.drop(columns="labels").equals(small_frame.drop(columns="labels"))
    other = classify_heads(
        small_model, text=PLANTED_TEXT, config=ClassifyConfig(n_seq=2, max_windows=2, seed=1, needles=False)
    ).frame
    assert not math.isclose(other["copying_score"].sum(), small_frame["copying_score"].sum())


# CLI ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "probe.txt"
    path.write_text(PLANTED_TEXT, encoding="utf-8")
    return path


def _run(args):
    return CliRunner().invoke(cli, ["classify", *args])


def test_cli_json_has_every_score_and_out_writes_both_files(small_model_dir, text_file, tmp_path):
    out = tmp_path / "out"
    result = _run(
        [
            str(small_model_dir),
            "--text",
            str(text_file),
            "--n-seq",
            "2",
            "--max-windows",
            "2",
            "--format",
            "json",
            "--out-dir",
            str(out),
            "--no-progress",
        ]
    )
    assert result.exit_code == 0, result.output
    objects = json.loads(result.stdout)
    assert len(objects) == 8
    for obj in objects:
        assert isinstance(obj["labels"], list) and {"layer", "head", *SCORE_COLUMNS} <= set(obj)
    saved = json.loads((out / "heads.json").read_text())
    key = lambda o: (o["layer"], o["head"])  # noqa: E731
    assert sorted(saved, key=key) == sorted(objects, key=key)
    assert (out / "heads.csv").read_text().startswith("layer,head,labels,")
    assert not list(out.glob("*.tmp"))


@pytest.mark.slow
def test_cli_table_is_deterministic_under_seed(small_model_dir, text_file):
    args = [
        str(small_model_dir),
        "--text",
        str(text_file),
        "--n-seq",
        "2",
        "--max-windows",
        "2",
        "--seed",
        "3",
        "--no-needles",
    ]
    first, second = _run(args), _run(args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    assert first.stdout.splitlines()[0].split()[:2] == ["head", "labels"]


# Errors ---------------------------------------------------------------------------------------


def test_config_rejects_out_of_range_values():
    with pytest.raises(ConfigError, match=r"positional_min = 1.5 is out of range: a number in \[0, 1\]"):
        ClassifyConfig(positional_min=1.5)
    with pytest.raises(ConfigError, match="n_seq = 0"):
        ClassifyConfig(n_seq=0)
    with pytest.raises(ConfigError, match="needle_depths = 0 is out of range: an integer >= 1"):
        ClassifyConfig(needle_depths=0)
    with pytest.raises(ConfigError, match="unknown threshold 'bogus'"):
        config_with_thresholds(ClassifyConfig(), ["bogus=0.5"])


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"\x00\x01\x02binary", "binary"),
        (b"caf\xe9 au lait", "not valid UTF-8"),
        (b"Hi", "too short"),
    ],
)
def test_cli_bad_text_is_one_line_exit_2(small_model_dir, tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    result = _run([str(small_model_dir), "--text", str(path), "--no-progress"])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threshold", "bogus=0.3"], "unknown threshold 'bogus'"),
        (["--threshold", "retrieval=2"], "--threshold retrieval=2.0 is out of range"),
        (["--threshold", "copying=abc"], "not a number"),
        (["--format", "xml"], "unknown format 'xml'"),
        (["--seq-len", "100"], "seq_len 100 is too long"),
        (["--seq-len", "20", "--token-budget", "32"], "seq_len 20 is too long for probe sequences of 32 tokens"),
        (["--token-budget", "4"], "token_budget = 4 is out of range"),
    ],
)
def test_cli_bad_options_are_one_line_exit_2(small_model_dir, text_file, args, message):
    result = _run([str(small_model_dir), "--text", str(text_file), "--no-progress", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_token_budget_sizes_every_probe(small_model):
    config = ClassifyConfig(n_seq=2, max_windows=2, seq_len=10, token_budget=32)
    info = classify_heads(small_model, text=PLANTED_TEXT, config=config).meta["probes"]
    assert info["sizes"] == {
        "n_ctx": 128,
        "token_budget": 32,
        "window": 32,
        "repeat_context": 32,
        "needle_context": 32,
        "capped": True,
    }
    assert info["longest_window"] == 32 and info["n_windows"] == 2  # BOS + 31 text tokens
    assert info["repeats"] == 3  # 1 + 3 * 10 <= 32
    assert info["n_needle_tests"] > 0 and info["longest_needle_prompt"] <= 32 and info["needle_len"] == 4
    longer = classify_heads(small_model, text=PLANTED_TEXT, config=replace(config, needle_budget=128)).meta["probes"]
    assert longer["sizes"]["needle_context"] == 128
    assert 32 < longer["longest_needle_prompt"] <= 128  # long-context needles stay available


@pytest.mark.slow
def test_cli_says_when_a_budget_cut_the_context(small_model_dir, text_file):
    args = [str(small_model_dir), "--text", str(text_file), "--n-seq", "2", "--max-windows", "2", "--no-progress"]
    cut = _run([*args, "--token-budget", "64", "--no-needles"])
    assert cut.exit_code == 0, cut.output
    assert "probes sized by a token budget, not the model's context of 128" in cut.stderr
    assert "at most 64 tokens" in cut.stderr and "--token-budget" in cut.stderr
    whole = _run([*args, "--no-needles"])
    assert whole.exit_code == 0 and "token budget" not in whole.stderr  # the default budget covers the whole context


def test_cli_unwritable_out_fails_before_work_and_keeps_old_files(small_model_dir, text_file, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    result = _run([str(small_model_dir), "--text", str(text_file), "--out-dir", str(blocker / "sub")])
    assert result.exit_code == 2 and "--out-dir" in result.stderr
    assert blocker.read_text() == "keep me"
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.csv").write_text("old results")
    result = _run([str(small_model_dir), "--text", str(text_file), "--out-dir", str(out), "--threshold", "x=1"])
    assert result.exit_code == 2
    assert (out / "heads.csv").read_text() == "old results"


def test_cli_report_writes_html_with_the_heads(small_model_dir, text_file, tmp_path):
    report = tmp_path / "report.html"
    result = _run(
        [
            str(small_model_dir),
            "--text",
            str(text_file),
            "--n-seq",
            "2",
            "--max-windows",
            "2",
            "--no-needles",
            "--report",
            str(report),
            "--no-progress",
        ]
    )
    assert result.exit_code == 0, result.output
    html = report.read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and "prefix_matching" in html
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.slow
def test_cli_report_in_spanish(small_model_dir, text_file, tmp_path):
    report = tmp_path / "informe.html"
    result = _run(
        [
            str(small_model_dir),
            "--text",
            str(text_file),
            "--n-seq",
            "2",
            "--max-windows",
            "2",
            "--no-needles",
            "--report",
            str(report),
            "--lang",
            "es",
            "--no-progress",
        ]
    )
    assert result.exit_code == 0, result.output
    html = report.read_text(encoding="utf-8")
    assert '<html lang="es">' in html and "Puntuaciones y etiquetas de las cabezas" in html


@pytest.mark.slow
def test_cli_short_text_notes_where_the_haystack_came_from(small_model_dir, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("Hello world", encoding="utf-8")
    result = _run([str(small_model_dir), "--text", str(path), "--n-seq", "2", "--format", "csv", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "needles_source = default_text" in result.stderr
    header, first = result.stdout.splitlines()[:2]
    row = dict(zip(header.split(","), first.split(","), strict=True))
    assert (row["text_source"], row["needles_source"]) == ("given_text", "default_text")


def test_cli_report_to_a_directory_fails_before_work(small_model_dir, text_file, tmp_path):
    result = _run([str(small_model_dir), "--text", str(text_file), "--report", str(tmp_path)])
    assert result.exit_code == 2 and "is a directory" in result.stderr


def test_progress_counts_the_probes_and_shows_the_vocabulary_passes(capsys, tiny_classified, tmp_path, monkeypatch):
    """With progress on, stderr carries a bar counting the registry's probes to the last, and the
    copy-suppression OV criterion's bar over the layers (an empty cache: the criteria are computed);
    the labels are those of a run without bars."""
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path))
    loaded, frame = tiny_classified
    result = classify_heads(loaded, progress=True)
    err = capsys.readouterr().err
    n = len(kinds.PROBES)
    assert "classify: 100%" in err and f"{n}/{n}" in err
    assert f"cs_ov_score:   0%|          | 0/{loaded.spec.n_layers}" in err  # its bar over the layers
    assert result.frame["labels"].tolist() == frame["labels"].tolist()
