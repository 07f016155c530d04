"""Hostile GGUF headers, written byte by byte with struct: every one is refused with one line and exit 2
before anything is allocated or converted, and nothing outside the cache is touched."""

from __future__ import annotations

import os
import struct
import time

import pytest

from tests.helpers.hostile import make_sentinel, refused

# GGUF value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
UINT32, INT32, STRING, ARRAY, UINT64 = 4, 5, 8, 9, 10
F32 = 0  # ggml type of a float32 tensor


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(value_type: int, value) -> bytes:
    if value_type == STRING:
        return struct.pack("<I", STRING) + gguf_string(value)
    fmt = {UINT32: "<I", INT32: "<i", UINT64: "<Q"}[value_type]
    return struct.pack("<I", value_type) + struct.pack(fmt, value)


def gguf_bytes(kv: dict, tensors=(), raw_kv: bytes = b"", extra_kv: int = 0) -> bytes:
    """A GGUF v3 file: `kv` {key: (type, value)}, `tensors` [(name, dims, ggml type, offset)], then
    `raw_kv` appended to the metadata as `extra_kv` further entries (for malformed values)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv) + extra_kv)
    for key, (value_type, value) in kv.items():
        out += gguf_string(key) + gguf_value(value_type, value)
    out += raw_kv
    for name, dims, ggml_type, offset in tensors:
        out += (
            gguf_string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", ggml_type, offset)
        )
    out += b"\0" * (-len(out) % 32) + b"\0" * 64  # alignment padding, a little data
    return out


LLAMA = {
    "general.architecture": (STRING, "llama"),
    "llama.block_count": (UINT32, 2),
    "llama.embedding_length": (UINT32, 64),
    "llama.attention.head_count": (UINT32, 4),
    "llama.attention.head_count_kv": (UINT32, 2),
}


def header(**changes) -> dict:
    """LLAMA with keys replaced (value a (type, value) pair) or removed (value None)."""
    kv = dict(LLAMA)
    for key, value in changes.items():
        key = key.replace("__", ".")
        kv.pop(key) if value is None else kv.__setitem__(key, value)
    return kv


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


def refuse_gguf(tmp_path, sentinel, data: bytes) -> str:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    start = time.perf_counter()
    line = refused("heads", "0.0", path, sentinel=sentinel)
    assert time.perf_counter() - start < 60, "refused only after the work"
    return line


@pytest.mark.parametrize(
    "alignment",
    [(UINT32, 0), (INT32, -8), (STRING, "32"), (UINT32, 24), (UINT64, 1 << 40)],
    ids=["zero", "negative", "string", "not-a-power-of-two", "huge"],
)
def test_alignment(tmp_path, sentinel, alignment):
    data = gguf_bytes({**LLAMA, "general.alignment": alignment}, [("t", (4,), F32, 0)])
    assert "general.alignment" in refuse_gguf(tmp_path, sentinel, data)


def test_tensor_dimensions_whose_product_overflows(tmp_path, sentinel):
    data = gguf_bytes(LLAMA, [("token_embd.weight", (2**62, 2**62, 2**40), F32, 0)])
    assert "truncated" in refuse_gguf(tmp_path, sentinel, data)


def test_too_many_tensor_dimensions(tmp_path, sentinel):
    data = gguf_bytes(LLAMA, [("t", (1,) * 64, F32, 0)])
    assert "dimensions" in refuse_gguf(tmp_path, sentinel, data)


def test_array_longer_than_the_file(tmp_path, sentinel):
    raw = gguf_string("tokenizer.ggml.scores") + struct.pack("<IIQ", ARRAY, UINT32, 2**61)
    assert "runs past the end" in refuse_gguf(tmp_path, sentinel, gguf_bytes(LLAMA, raw_kv=raw, extra_kv=1))


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"general__architecture": None}, "no general.architecture"),
        ({"general__architecture": (UINT32, 7)}, "no general.architecture"),
        ({"llama__attention__head_count": (UINT32, 0)}, "attention heads: expected"),
        ({"llama__attention__head_count": (UINT32, 6)}, "do not divide the width"),
        ({"llama__attention__head_count_kv": (UINT32, 3)}, "do not divide"),
        ({"llama__block_count": (UINT32, 100_000)}, "layers: expected"),
        ({"llama__block_count": (INT32, -2)}, "layers: expected"),
        ({"llama__embedding_length": (UINT64, 2**40)}, "width: expected"),
        ({"llama__block_count": (STRING, "2")}, "layers: expected"),
    ],
    ids=[
        "no-arch",
        "arch-not-string",
        "zero-heads",
        "heads-not-dividing",
        "kv-not-dividing",
        "100k-blocks",
        "negative-blocks",
        "huge-width",
        "blocks-a-string",
    ],
)
def test_shape_facts(tmp_path, sentinel, changes, said):
    data = gguf_bytes(header(**changes), [("t", (4,), F32, 0)])
    assert said in refuse_gguf(tmp_path, sentinel, data)


def test_control_characters_from_the_file_are_escaped(tmp_path, sentinel):
    """An architecture name holding ESC and BEL reaches the terminal escaped."""
    evil = "\x1b[2J\x1b]0;owned\x07llama"
    data = gguf_bytes({"general.architecture": (STRING, evil), f"{evil}.block_count": (UINT32, 0)})
    line = refuse_gguf(tmp_path, sentinel, data)
    assert "\x1b" not in line and "\x07" not in line and "\\x1b" in line


def test_huge_unused_array_is_not_kept(tmp_path):
    """A 4M-item numeric array under a key no reader uses is walked over, not turned into Python objects;
    one under a tokenizer key past any vocabulary is refused."""
    from headlens.load.gguf_read import read_gguf

    count = 4_000_000
    raw = gguf_string("general.junk") + struct.pack("<IIQ", ARRAY, 0, count) + b"\x01" * count  # uint8 items
    path = tmp_path / "junk.gguf"
    path.write_bytes(gguf_bytes(LLAMA, [("t", (4,), F32, 0)], raw_kv=raw, extra_kv=1))
    parsed = read_gguf(path)
    assert "general.junk" not in parsed.metadata and parsed.metadata["llama.block_count"] == 2


def test_huge_tokenizer_array_is_refused(tmp_path, sentinel):
    count = 5_000_000
    raw = gguf_string("tokenizer.ggml.token_type") + struct.pack("<IIQ", ARRAY, 0, count) + b"\x01" * count
    line = refuse_gguf(tmp_path, sentinel, gguf_bytes(LLAMA, [("t", (4,), F32, 0)], raw_kv=raw, extra_kv=1))
    assert "more than the" in line and "vocabulary" in line


def test_sparse_terabyte_is_refused_before_it_is_hashed(tmp_path, sentinel, monkeypatch):
    """A small valid header followed by a terabyte of holes: refused from its header, never read whole."""
    import headlens.load.locate

    def never(path):
        raise AssertionError("hashed before the header was checked")

    monkeypatch.setattr(headlens.load.locate, "file_sha256", never)
    path = tmp_path / "sparse.gguf"
    path.write_bytes(gguf_bytes(LLAMA, [("t", (4,), F32, 0)]))
    os.truncate(path, 1 << 40)
    start = time.perf_counter()
    line = refused("heads", "0.0", path, sentinel=sentinel)
    assert "past the end of its tensor data" in line and time.perf_counter() - start < 30
