"""Hostile Ollama stores and names: a manifest's digest or a model name never leads a path out of the
store or the cache, and nothing outside headlens's own cache entries is ever removed."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from headlens import cache as core_cache
from headlens.errors import ModelLoadError
from headlens.load import cache, ollama
from tests.helpers.hostile import assert_intact, make_sentinel, refused


@pytest.fixture(autouse=True)
def hostile_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


def write_manifest(store: Path, digest: str, name: str = "evil", tag: str = "latest") -> Path:
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": ollama.MODEL_MEDIA_TYPE, "digest": digest}]}))
    return manifest


def plant_blob(store: Path, relative: str) -> None:
    """A file at blobs/sha256-RELATIVE, so the store holds the 'blob' a hostile digest names."""
    blob = store / "blobs" / f"sha256-{relative}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(b"GGUF not a model")


def test_absolute_digest_deletes_nothing(tmp_path, sentinel):
    """`sha256:/abs/dir` once became the cache key `/abs/dir`, and the cache removed that folder."""
    store = tmp_path / "store"
    write_manifest(store, f"sha256:{sentinel}")
    plant_blob(store, str(sentinel).lstrip("/"))  # blobs/sha256-/abs/dir: a file inside the store
    plant_blob(store, str(sentinel))
    line = refused("heads", "0.0", "ollama:evil", sentinel=sentinel)
    assert "digest" in line and "64 hex" in line


def test_dotdot_digest_deletes_nothing(tmp_path):
    """`sha256:../../victim`: blobs/sha256-../../victim is inside the store, cache/converted/../../victim is not."""
    victim = make_sentinel(tmp_path / "victim")
    store = tmp_path / "store"
    write_manifest(store, "sha256:../../victim")
    (store / "blobs" / "sha256-..").mkdir(parents=True)
    (store / "blobs" / "victim").write_bytes(b"GGUF not a model")
    line = refused("heads", "0.0", "ollama:evil", sentinel=victim)
    assert "digest" in line


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "A" * 64, "sha256:" + "0" * 63, "sha512:" + "0" * 64, "sha256:" + "0" * 64 + "\n", "", 7, None],
)
def test_digests_outside_the_grammar(tmp_path, sentinel, digest):
    store = tmp_path / "store"
    write_manifest(store, digest)
    assert "headlens: error:" in refused("heads", "0.0", "ollama:evil", sentinel=sentinel)


@pytest.mark.parametrize(
    "name",
    [
        "ollama:x:/etc/passwd",
        "ollama:../../etc:passwd",
        "ollama:..",
        "ollama:x:..",
        "ollama:a/b/c/d",
        "ollama:.hidden",
        "ollama:ns.dot/model",
        "ollama:model:tag/x:y",
        "ollama:",
        "ollama:" + "m" * 81,
        "ollama:mo\x1bdel",
    ],
)
def test_names_outside_the_grammar_are_refused_before_any_read(tmp_path, sentinel, name, monkeypatch):
    """A name is checked against Ollama's grammar before a single file is opened."""
    opened = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    with pytest.raises(ModelLoadError, match="not an Ollama model name"):
        ollama.ollama_blob(name)
    monkeypatch.undo()
    assert opened == []
    assert "not an Ollama model name" in refused("heads", "0.0", name, sentinel=sentinel)


def test_manifest_outside_the_store_is_never_read(tmp_path, sentinel):
    """`ollama:x:/abs/manifest` once read any file as a manifest; a valid one outside the store would load."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest").write_text(json.dumps({"layers": [{"mediaType": ollama.MODEL_MEDIA_TYPE}]}))
    (tmp_path / "store").mkdir()
    assert "not an Ollama model name" in refused("heads", "0.0", f"ollama:x:{outside}/manifest", sentinel=sentinel)


def test_links_out_of_the_store_are_refused(tmp_path, sentinel):
    """A manifest or blob that is a symbolic link to a file outside the store is not followed."""
    store = tmp_path / "store"
    hexdigest = "ab" * 32
    write_manifest(store, f"sha256:{hexdigest}")
    (store / "blobs").mkdir()
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"GGUF elsewhere")
    (store / "blobs" / f"sha256-{hexdigest}").symlink_to(outside)
    assert "outside the Ollama store" in refused("heads", "0.0", "ollama:evil", sentinel=sentinel)
    linked = store / "manifests" / "registry.ollama.ai" / "library" / "linked" / "latest"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(tmp_path / "outside.gguf")
    assert "outside the Ollama store" in refused("heads", "0.0", "ollama:linked", sentinel=sentinel)


def test_oversized_manifest_is_not_read_whole(tmp_path, sentinel):
    manifest = write_manifest(tmp_path / "store", "sha256:" + "0" * 64)
    manifest.write_bytes(b" " * (ollama.MAX_MANIFEST + 1))
    assert "names no model layer" in refused("heads", "0.0", "ollama:evil", sentinel=sentinel)


def test_valid_names_parse_as_ollama_does():
    assert ollama.parse_name("ollama:llama3") == ("registry.ollama.ai", "library", "llama3", "latest")
    assert ollama.parse_name("ollama:me/m_1.5:Q4-k") == ("registry.ollama.ai", "me", "m_1.5", "Q4-k")
    assert ollama.parse_name("ollama:host.io:5000/ns/m") == ("host.io:5000", "ns", "m", "latest")


# The cache: keys are sha256s, and only headlens's own entries are ever removed


def test_cache_refuses_a_key_that_is_not_a_sha256(sentinel):
    for key in (str(sentinel), "../sentinel", "A" * 64, "0" * 63):
        with pytest.raises(ModelLoadError, match="not a sha256"):
            cache.converted_entry(key, lambda folder: pytest.fail("built"))
    assert_intact(sentinel)


def test_cache_never_removes_a_folder_it_did_not_write(tmp_path, sentinel):
    """A folder in an entry's place without headlens's record is refused, not removed; a link there
    loses only the link."""
    key = "cd" * 32
    root = tmp_path / "cache" / "converted"
    root.mkdir(parents=True)
    (root / cache.converted_key(key)).symlink_to(sentinel, target_is_directory=True)

    def build(folder: Path) -> dict:
        (folder / "config.json").write_text("{}")
        return {"format": "gguf"}

    entry, record = cache.converted_entry(key, build)
    assert_intact(sentinel) and entry.is_dir() and not entry.is_symlink()
    other = "ef" * 32
    (root / cache.converted_key(other)).mkdir()
    (root / cache.converted_key(other) / "mine.txt").write_text("not headlens's")
    with pytest.raises(ModelLoadError, match="did not write it"):
        cache.converted_entry(other, build)
    assert (root / cache.converted_key(other) / "mine.txt").is_file()


def test_killed_conversion_folders_are_swept_and_no_lock_file_stays(tmp_path):
    key, live = "12" * 32, "34" * 32
    root = tmp_path / "cache" / "converted"
    root.mkdir(parents=True)
    killed = root / f".{key}-abc123"
    (killed / "big").mkdir(parents=True)
    (killed / "big" / "model.safetensors").write_bytes(b"0" * 1024)
    stranger = root / ".notakey-abc"
    stranger.mkdir()
    with core_cache.locked(root / f"{live}.lock"):  # a conversion in progress in another process
        busy = root / f".{live}-xyz789"
        busy.mkdir()
        assert core_cache.sweep_killed(root) == 1
        assert not killed.exists() and busy.is_dir() and stranger.is_dir()
    cache.converted_entry(key, lambda folder: (folder / "config.json").write_text("{}") and {})
    assert sorted(p.name for p in root.iterdir() if p.suffix == ".lock") == []
