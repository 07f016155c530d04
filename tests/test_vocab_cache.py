"""Copy suppression's vocabulary criteria kept in headlens's cache (headlens.classify.vocab_cache): a second
classification reads them back instead of computing them, with the same frame; a damaged entry or another
setting computes them again; the switch turns the cache off."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headlens.classify import ClassifyConfig, classify_heads, kind_runs, vocab_cache
from headlens.load.locate import ModelSource
from headlens.load.models import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """An empty cache, and the number of times the criteria are computed."""
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path))
    monkeypatch.delenv(vocab_cache.NO_CACHE_ENV, raising=False)
    calls = []
    compute = kind_runs.vocab_criteria

    def counting(run):
        calls.append(run.config.cs_ov_min)
        return compute(run)

    monkeypatch.setattr(kind_runs, "vocab_criteria", counting)
    return calls, tmp_path


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_a_second_classification_reads_the_criteria_back(tiny, counted):
    calls, root = counted
    config = ClassifyConfig(n_seq=2, max_windows=2, needles=False)
    first = classify_heads(tiny, config=config)
    second = classify_heads(tiny, config=config)
    assert len(calls) == 1  # computed once, then read back
    _frames_equal(first.frame, second.frame)
    assert first.meta["probes"]["cs_qk_layers"] == second.meta["probes"]["cs_qk_layers"]
    entries = list((root / vocab_cache.KIND).glob("*/data"))
    assert len(entries) == 1
    entries[0].write_bytes(b"not a tensor file")  # damaged: computed again, same answer
    third = classify_heads(tiny, config=config)
    assert len(calls) == 2
    _frames_equal(first.frame, third.frame)


def test_another_ov_cut_off_or_the_switch_computes_again(tiny, counted, monkeypatch):
    calls, _ = counted
    classify_heads(tiny, config=ClassifyConfig(n_seq=2, max_windows=2, needles=False))
    classify_heads(tiny, config=ClassifyConfig(n_seq=2, max_windows=2, needles=False, cs_ov_min=0.0))
    assert calls == [ClassifyConfig().cs_ov_min, 0.0]  # the cut-off gates the QK layers: its own entry
    monkeypatch.setenv(vocab_cache.NO_CACHE_ENV, "1")
    classify_heads(tiny, config=ClassifyConfig(n_seq=2, max_windows=2, needles=False))
    assert len(calls) == 3


def test_a_model_edited_after_loading_gets_its_own_entry():
    """The key reads the weights in memory, not only the file they came from: a GGUF-sourced model
    (its source's sha256 unchanged) with one weight edited is keyed apart."""
    loaded = load_model("tiny")
    loaded.source = ModelSource(format="gguf", quantization="F32", sha256="0" * 64, file="x.gguf")
    before = vocab_cache.vocab_key(loaded, 0, 0.5)
    with torch.no_grad():
        next(loaded.model.parameters()).view(-1)[0] += 1.0  # one weight edited in place
    assert vocab_cache.vocab_key(loaded, 0, 0.5) != before
