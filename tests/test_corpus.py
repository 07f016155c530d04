"""Corpora: a folder of .txt files and a JSON Lines file stream the same documents, and classify
scores them exactly as the same texts handed over one by one."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headlens.classify import ClassifyConfig, classify_heads
from headlens.errors import InputTextError
from headlens.probes.corpus import Corpus
from headlens.probes.inputs import MIN_TEXT_TOKENS
from tests.helpers.strong import sample_text

DOCS = [sample_text(150, seed=1), sample_text(700, seed=2), "a", sample_text(400, seed=3)]
CONFIG = ClassifyConfig(n_seq=2, max_windows=32)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "docs"
    (root / "nested").mkdir(parents=True)
    # sorted by path: a.txt, b.txt, c.txt, nested/d.txt; notes.md is not a .txt document
    for name, doc in zip(["a.txt", "b.txt", "c.txt", "nested/d.txt"], DOCS, strict=True):
        (root / name).write_text(doc, encoding="utf-8")
    (root / "notes.md").write_text("not a document", encoding="utf-8")
    return root


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": doc, "id": i}) for i, doc in enumerate(DOCS)]
    path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n", encoding="utf-8")
    return path


def test_folder_and_jsonl_stream_the_documents_in_order(folder, jsonl):
    for corpus in (Corpus(folder), Corpus(jsonl)):
        assert len(corpus) == len(DOCS)
        assert list(corpus) == DOCS
        assert list(corpus) == DOCS  # iterable again


@pytest.mark.slow
def test_a_folder_and_a_jsonl_score_like_the_documents_fed_one_by_one(small_model, folder, jsonl, one_thread):
    reference = classify_heads(small_model, iter(DOCS), CONFIG)  # a plain iterator: no length needed
    for corpus in (Corpus(folder), Corpus(jsonl)):
        heads = classify_heads(small_model, corpus, CONFIG)
        pd.testing.assert_frame_equal(heads.frame, reference.frame)
        assert heads.meta["probes"] == reference.meta["probes"]
    probes = reference.meta["probes"]
    assert probes["n_documents"] == len(DOCS)
    ids = [small_model.tokenizer(doc, add_special_tokens=False)["input_ids"] for doc in DOCS]
    body = small_model.spec.n_ctx - 1
    assert probes["n_text_tokens"] == sum(len(i) for i in ids)
    # windows never span two documents: each document is cut on its own ("a" is too short to score)
    assert probes["n_windows"] == sum(-(-len(i) // body) for i in ids if len(i) >= MIN_TEXT_TOKENS)


def test_documents_are_not_one_concatenated_text(small_model, one_thread):
    """Windows restart at each document: the joined text is cut into other windows."""
    config = ClassifyConfig(n_seq=2, needles=False)
    body = small_model.spec.n_ctx - 1
    lengths = [len(small_model.tokenizer(doc, add_special_tokens=False)["input_ids"]) for doc in DOCS[:2]]
    apart = classify_heads(small_model, iter(DOCS[:2]), config).meta["probes"]
    joined = classify_heads(small_model, "".join(DOCS[:2]), config).meta["probes"]
    assert apart["n_windows"] == sum(-(-n // body) for n in lengths)
    assert joined["n_windows"] == -(-joined["n_text_tokens"] // body)
    assert apart["n_windows"] != joined["n_windows"]


def test_one_text_file_is_one_document(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text(DOCS[1], encoding="utf-8")
    assert list(Corpus(path)) == [DOCS[1]]


# Errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "fine"}\n{"text": "broken\n', "docs.jsonl:2 is not valid JSON"),
        ('{"text": "fine"}\n["a list"]\n', "docs.jsonl:2 has no string 'text' field"),
        ('{"body": "no text field"}\n', "docs.jsonl:1 has no string 'text' field"),
        ("\n\n", "holds no documents"),
    ],
)
def test_bad_jsonl_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "docs.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputTextError, match=message):
        Corpus(path)


def test_non_utf8_jsonl_line_is_refused(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(InputTextError, match="docs.jsonl:2 is not valid UTF-8"):
        Corpus(path)


def test_non_utf8_file_in_a_folder_is_refused(folder):
    (folder / "bad.txt").write_bytes(b"caf\xe9 au lait")
    with pytest.raises(InputTextError, match="bad.txt is not valid UTF-8"):
        Corpus(folder)


def test_empty_folder_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("no txt here", encoding="utf-8")
    with pytest.raises(InputTextError, match="holds no .txt files"):
        Corpus(tmp_path / "empty")


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(InputTextError, match="text not found"):
        Corpus(tmp_path / "nope")


# Ablation and pruning on a corpus ------------------------------------------------------------------


def test_ablation_evalset_of_a_corpus_is_each_documents_windows(small_model, folder, jsonl):
    """The loss evaluation set of a folder / JSON Lines file is the documents' own windows, in order,
    BOS first, never spanning two documents (cut here by hand from the tokenizer)."""
    from headlens.intervene.evalset import text_evalset

    body = small_model.spec.n_ctx - 1
    bos = small_model.bos_token_id
    expected = []
    for doc in DOCS:
        ids = small_model.tokenizer(doc, add_special_tokens=False)["input_ids"]
        expected += [[bos, *ids[start : start + body]] for start in range(0, len(ids), body)]
    for corpus in (Corpus(folder), Corpus(jsonl)):
        evalset = text_evalset(small_model, corpus, max_windows=100)
        got = [row[mask].tolist() for row, mask in zip(evalset.input_ids, evalset.mask, strict=True)]
        assert got == expected
        assert "of 4 documents" in evalset.description


def test_ablation_on_a_folder_equals_the_jsonl_of_the_same_documents(small_model, folder, jsonl, one_thread):
    from headlens.ablation import ablate_heads
    from headlens.heads import Head

    results = [ablate_heads(small_model, [Head(0, 1)], text=Corpus(path)).meta for path in (folder, jsonl)]
    assert results[0]["delta_loss"] == results[1]["delta_loss"] and results[0]["n_tokens"] == results[1]["n_tokens"]
    joined = ablate_heads(small_model, [Head(0, 1)], text="".join(DOCS)).meta
    # the same tokens are predicted, from other contexts: documents are not one concatenated text
    assert joined["n_tokens"] == results[0]["n_tokens"] and joined["loss"] != results[0]["loss"]


def test_a_corpus_evalset_stops_reading_at_the_window_cap(small_model, folder):
    """Documents are read until the cap: a stream that raises after the cap is never read that far."""
    from headlens.intervene.evalset import text_evalset

    def documents():
        yield DOCS[1]
        yield DOCS[1]
        raise AssertionError("read past the cap")

    evalset = text_evalset(small_model, documents(), max_windows=2)
    assert evalset.input_ids.shape[0] == 2 and "capped" in evalset.description


@pytest.mark.slow
def test_cli_ablate_and_prune_read_a_folder_and_refuse_it_for_the_needle_metric(small_model_dir, folder, jsonl):
    from click.testing import CliRunner

    from headlens.cli.main import cli

    runner = CliRunner()
    ok = runner.invoke(
        cli, ["ablate", str(small_model_dir), "--heads", "0.1", "--text", str(folder), "--format", "json"]
    )
    assert ok.exit_code == 0, ok.output
    assert "4 documents" in ok.output
    prune = runner.invoke(
        cli,
        [
            "prune",
            str(small_model_dir),
            "--text",
            str(jsonl),
            "--no-roles",
            "--step-fraction",
            "0.5",
            "--format",
            "json",
        ],
    )
    assert prune.exit_code == 0, prune.output
    bad = runner.invoke(
        cli, ["ablate", str(small_model_dir), "--heads", "0.1", "--metric", "needle", "--text", str(folder)]
    )
    assert bad.exit_code == 2 and "metric needle reads one text" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
