"""headlens's one cache (headlens.cache) and `headlens cache`: keys, entries written whole and read back, damaged
entries computed again, least-recently-used eviction under a size limit, and removal of headlens's own entries
only; and the classification cache keyed by the weights in memory (a model edited after loading classifies
again)."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from headlens import cache
from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify import cache as classify_cache
from headlens.cli.main import cli
from headlens.errors import ConfigError
from headlens.load.locate import ModelSource
from headlens.load.models import load_model
from tests.helpers.hostile import assert_intact, make_sentinel

KIND = "clean-runs"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cache.MAX_GB_ENV, raising=False)
    return tmp_path / "cache"


def _aged(kind: str, entry_key: str, when: float) -> None:
    """Set an entry's last use to `when` (seconds since the epoch)."""
    os.utime(cache.cache_root() / kind / entry_key, (when, when))


def test_keys_name_the_kind_its_version_the_digest_and_every_fact(monkeypatch):
    base = cache.key(KIND, "d" * 64, seed=0)
    assert cache.SHA256_HEX.fullmatch(base)
    assert cache.key(KIND, "d" * 64, seed=0) == base
    others = {
        cache.key("classify", "d" * 64, seed=0),
        cache.key(KIND, "e" * 64, seed=0),
        cache.key(KIND, "d" * 64, seed=1),
        cache.key(KIND, "d" * 64, seed=0, dtype="float32"),
    }
    monkeypatch.setitem(cache.VERSION, KIND, cache.VERSION[KIND] + 1)  # a new version: old entries never read
    others.add(cache.key(KIND, "d" * 64, seed=0))
    assert len(others) == 5 and base not in others


def test_put_then_get_and_a_bad_key_is_refused(root):
    entry_key = cache.key(KIND, "d" * 64)
    assert cache.get(KIND, entry_key) is None
    cache.put(KIND, entry_key, b"\x00\x01 bytes", model="tiny")
    assert cache.get(KIND, entry_key) == b"\x00\x01 bytes"
    record = json.loads((root / KIND / entry_key / cache.RECORD).read_text())
    assert record["model"] == "tiny" and record["version"] == cache.VERSION[KIND]
    assert record["files"] == {cache.DATA: len(b"\x00\x01 bytes")}
    for bad in ("../x", "A" * 64, str(root)):
        with pytest.raises(ValueError, match="not a cache entry"):
            cache.get(KIND, bad)
    with pytest.raises(ValueError, match="not a cache entry"):
        cache.get("no-such-kind", entry_key)


@pytest.mark.parametrize("damage", ["truncate", "delete", "record", "other version"])
def test_a_damaged_entry_reads_as_absent_and_is_written_again(root, damage):
    entry_key = cache.key(KIND, "d" * 64)
    cache.put(KIND, entry_key, b"0123456789")
    folder = root / KIND / entry_key
    if damage == "truncate":
        (folder / cache.DATA).write_bytes(b"01234")
    elif damage == "delete":
        (folder / cache.DATA).unlink()
    elif damage == "record":
        (folder / cache.RECORD).write_text("{not json")
    else:
        record = json.loads((folder / cache.RECORD).read_text())
        (folder / cache.RECORD).write_text(json.dumps({**record, "version": cache.VERSION[KIND] - 1}))
    assert cache.get(KIND, entry_key) is None
    cache.put(KIND, entry_key, b"0123456789")
    assert cache.get(KIND, entry_key) == b"0123456789"


def test_put_replaces_an_entry_its_reader_found_damaged(root):
    """Bytes of the right size that do not parse: the reader computes again and put writes over them."""
    entry_key = cache.key(KIND, "d" * 64)
    cache.put(KIND, entry_key, b"0123456789")
    (root / KIND / entry_key / cache.DATA).write_bytes(b"xxxxxxxxxx")
    cache.put(KIND, entry_key, b"0123456789")
    assert cache.get(KIND, entry_key) == b"0123456789"


def test_lru_eviction_under_a_tiny_cap_evicts_the_least_recently_used_first(root, monkeypatch):
    """Four entries of 1,000 bytes (plus records); the cap holds three: the one used longest ago goes, and
    reading an entry makes it recent."""
    keys = [cache.key(KIND, "d" * 64, n=n) for n in range(4)]
    for n, entry_key in enumerate(keys[:3]):
        cache.put(KIND, entry_key, bytes(1000))
        _aged(KIND, entry_key, 1_000_000 + n)  # used in the order 0, 1, 2
    assert cache.get(KIND, keys[0]) == bytes(1000)  # 0 read now: 1 is the least recently used
    one = cache.entries()[0].size
    monkeypatch.setenv(cache.MAX_GB_ENV, str(3.5 * one / 1e9))
    cache.put(KIND, keys[3], bytes(1000))
    assert [cache.get(KIND, k) is not None for k in keys] == [True, False, True, True]
    monkeypatch.setenv(cache.MAX_GB_ENV, "0")  # nothing fits: every entry goes but the one just written
    cache.put(KIND, cache.key(KIND, "e" * 64), b"x")
    assert [e.key for e in cache.entries()] == [cache.key(KIND, "e" * 64)]


def test_a_size_limit_that_is_not_a_number_is_one_clear_error(root, monkeypatch):
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv(cache.MAX_GB_ENV, bad)
        with pytest.raises(ConfigError, match=cache.MAX_GB_ENV):
            cache.max_bytes()
        with pytest.raises(ConfigError, match=cache.MAX_GB_ENV):  # on the first read, before any work
            cache.get(KIND, cache.key(KIND, "d" * 64))
    monkeypatch.setenv(cache.MAX_GB_ENV, "1.5")
    assert cache.max_bytes() == 1_500_000_000


def _plant_strangers(root, sentinel):
    """Things in the cache folder headlens did not write, each shaped like something it did."""
    (root / "keep.txt").write_text("mine")
    lookalike = root / KIND / ("ab" * 32)
    lookalike.mkdir(parents=True)
    (lookalike / "data").write_text("mine")  # named like an entry, no record
    (root / KIND / ("cd" * 32)).symlink_to(sentinel, target_is_directory=True)  # a link named like an entry
    (root / "classify" / ("ef" * 32)).parent.mkdir(parents=True, exist_ok=True)
    (root / "classify" / ("ef" * 32)).write_text("a file named like an entry")
    (root / "gguf").mkdir()
    (root / "gguf" / "model.gguf").write_bytes(b"GGUF")  # a pulled model is not an entry
    return [root / "keep.txt", lookalike / "data", root / "classify" / ("ef" * 32), root / "gguf" / "model.gguf"]


def test_eviction_and_clear_remove_only_headlens_entries(root, tmp_path, monkeypatch):
    sentinel = make_sentinel(tmp_path / "sentinel")
    cache.put(KIND, cache.key(KIND, "d" * 64), bytes(100))
    kept = _plant_strangers(root, sentinel)
    monkeypatch.setenv(cache.MAX_GB_ENV, "0")
    cache.put("classify", cache.key("classify", "d" * 64), bytes(100))
    assert len(cache.entries()) == 1  # the older entry evicted, the strangers not counted nor touched
    assert cache.clear() and cache.entries() == []
    assert all(path.read_bytes() for path in kept)
    assert (root / KIND / ("cd" * 32)).is_symlink()
    assert_intact(sentinel)


def test_put_leaves_a_folder_it_did_not_write_in_its_place(root):
    entry_key = cache.key(KIND, "d" * 64)
    (root / KIND / entry_key).mkdir(parents=True)
    (root / KIND / entry_key / "mine.txt").write_text("not headlens's")
    cache.put(KIND, entry_key, b"x")  # skipped: a cache is never needed for the answer
    assert cache.get(KIND, entry_key) is None
    assert (root / KIND / entry_key / "mine.txt").read_text() == "not headlens's"


# `headlens cache`


def test_cache_list_shows_a_run_and_clear_removes_only_headlens_entries(root, tmp_path):
    sentinel = make_sentinel(tmp_path / "sentinel")
    runner = CliRunner()
    assert runner.invoke(cli, ["ablate", "tiny", "--heads", "1.0"]).exit_code == 0
    listed = runner.invoke(cli, ["cache", "list", "--format", "json"])
    document = json.loads(listed.output)
    assert [(row["kind"], row["model"], row["entries"]) for row in document["rows"]] == [("clean-runs", "tiny", 1)]
    entry = next((root / "clean-runs").iterdir())
    assert document["rows"][0]["bytes"] == sum(p.stat().st_size for p in entry.iterdir())
    assert document["meta"]["total_bytes"] == document["rows"][0]["bytes"]
    table = runner.invoke(cli, ["cache", "list"]).output
    assert "clean-runs" in table and "tiny" in table and "kB" in table
    kept = _plant_strangers(root, sentinel)
    refused = runner.invoke(cli, ["cache", "clear"], input="n\n")
    assert refused.exit_code == 1 and entry.is_dir()  # asked, answered no: nothing removed
    assert runner.invoke(cli, ["cache", "clear", "--kind", "classify", "--yes"]).exit_code == 0
    assert entry.is_dir()  # another kind: kept
    cleared = runner.invoke(cli, ["cache", "clear", "--yes"])
    assert cleared.exit_code == 0 and "removed 1 entries" in cleared.output
    assert not entry.exists() and all(path.read_bytes() for path in kept)
    assert_intact(sentinel)
    assert "no entries" in runner.invoke(cli, ["cache", "list"]).output


def test_cache_bad_kind_is_one_line_and_exit_2(root):
    result = CliRunner().invoke(cli, ["cache", "clear", "--kind", "nope", "--yes"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


# The classification cache: one digest, of the weights in memory

SMALL = ClassifyConfig(n_seq=2, max_windows=2, needles=False)


def test_a_model_edited_after_loading_gets_a_fresh_classification(root, monkeypatch):
    """A GGUF-sourced model (its source's sha256 unchanged by the edit, so a key made from the file alone
    would read back the first classification) with one head's output weights zeroed in place: the cache
    gives the edited model's own classification, equal to classifying it directly."""
    calls = []

    def small(loaded, progress=False):
        calls.append(loaded.digest())
        return classify_heads(loaded, config=SMALL)

    monkeypatch.setattr(classify_cache, "classify_heads", small)
    loaded = load_model("tiny")
    loaded.source = ModelSource(format="gguf", quantization="F32", sha256="0" * 64, file="x.gguf")
    first = classify_cache.cached_classification(loaded)
    again = classify_cache.cached_classification(loaded)
    assert len(calls) == 1 and list(again["labels"]) == list(first["labels"])  # read back
    weight = dict(loaded.model.named_parameters())["transformer.h.0.attn.c_proj.weight"]
    with torch.no_grad():
        weight.zero_()  # layer 0's attention output, edited in place after loading
    fresh = classify_cache.cached_classification(loaded)
    assert len(calls) == 2 and calls[0] != calls[1]
    direct = classify_heads(loaded, config=SMALL).frame
    scores = [c for c in direct.columns if c.endswith("_score")]
    pd.testing.assert_frame_equal(fresh[scores], direct[scores])
    assert not np.allclose(fresh[scores].to_numpy(float), first[scores].to_numpy(float), equal_nan=True)
    read = classify_cache.cached_classification(loaded)  # and the edited model's entry is read back
    assert len(calls) == 2 and np.allclose(read[scores].to_numpy(float), fresh[scores].to_numpy(float), equal_nan=True)


def test_the_entry_just_written_stays_when_the_cache_root_is_a_link(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "link"))
    monkeypatch.setenv(cache.MAX_GB_ENV, "0")
    for n in range(2):
        cache.put(KIND, cache.key(KIND, "d" * 64, n=n), b"x")
    assert [e.key for e in cache.entries()] == [cache.key(KIND, "d" * 64, n=1)]
