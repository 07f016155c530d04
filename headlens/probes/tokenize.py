"""Tokenizing text of any length in bounded memory, and every call into the model's tokenizer in one guarded
place. A tokenizer's memory grows with its input (tens of bytes per character), so a long text is tokenized
piece by piece (`token_pieces`) and only as far as a reader needs (`token_ids`). A tokenizer that cannot finish
(a hostile tokenizer.json whose regex exhausts Oniguruma's retry limit: the Rust library panics) is one
InputTextError: `encode`, `encode_offsets`, `decode` and `decode_each` are the only ways headlens calls a
tokenizer, each through `guarded`, which also keeps the panic's own lines (Rust's panic hook writes to file
descriptor 2, and nothing in Python can silence it) off the terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

from headlens.errors import InputTextError

# Characters of a text tokenized in one call: a tokenizer's memory grows with its input (tens of bytes per
# character), so a long text is tokenized piece by piece and only as far as a reader needs
TOKENIZE_CHARS = 1 << 18

# One redirection of file descriptor 2 at a time (the explorer tokenizes in worker threads); re-entrant, an
# inner block runs inside the outer one's
_QUIET = threading.RLock()
# The temporary file stderr goes to while a tokenizer runs (opened once per process), the process that opened
# it, and the panics of the outermost block now running
_HELD: dict = {"file": None, "pid": None, "panics": None}


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text`, no special tokens (guarded)."""
    return list(guarded("this text", tokenizer, text, add_special_tokens=False)["input_ids"])


def encode_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(token ids, each token's (start, end) characters in `text`), no special tokens (guarded)."""
    encoded = guarded("this text", tokenizer, text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(pair) for pair in encoded["offset_mapping"]]


def decode(tokenizer, ids: list[int]) -> str:
    """The text of token ids (guarded)."""
    return guarded("these tokens", tokenizer.decode, list(ids))


def decode_each(tokenizer, ids: list[int]) -> list[str]:
    """The text of each token id alone, in one guarded call (not one per token)."""
    return guarded("these tokens", lambda: [tokenizer.decode([i]) for i in ids])


def guarded(what: str, call, *args, **kwargs):
    """call(*args, **kwargs), a tokenizer call on `what` (named in the error): a Rust panic inside it (pyo3's
    PanicException, which derives from BaseException; a tokenizer.json regex past Oniguruma's retry limit) is
    InputTextError, with the panic's own lines kept off the terminal (rust_quiet)."""
    with rust_quiet() as panicked:
        try:
            return call(*args, **kwargs)
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            panicked.append(exc)
    raise InputTextError(
        f"the model's tokenizer failed on {what} (a pattern of its tokenizer.json gave up: "
        f"{str(panicked[0])[:80]}): the tokenizer files are damaged or hostile"
    )


@contextlib.contextmanager
def rust_quiet():
    """While the block runs, stderr (file descriptor 2) goes to a temporary file; what was written there is
    written back to stderr afterwards unless the block appended to the list it receives (a panic: Rust's
    panic hook prints its own lines, which a one-line error must not be followed by). Blocks run one at a
    time; what another thread writes to stderr meanwhile is held and written back with the rest."""
    with _QUIET:
        if _HELD["panics"] is not None:  # inside another block: the outer one decides
            yield _HELD["panics"]
            return
        held = _held_file()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        _HELD["panics"] = panicked = []
        try:
            yield panicked
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _HELD["panics"] = None
            _release(held, write_back=not panicked)


def _held_file():
    if _HELD["file"] is None or _HELD["pid"] != os.getpid():  # a forked child opens its own
        _HELD["file"], _HELD["pid"] = tempfile.TemporaryFile(buffering=0), os.getpid()
    return _HELD["file"]


def _release(held, write_back: bool) -> None:
    """Write what `held` holds to stderr (when `write_back`), then empty it for the next block."""
    size = os.fstat(held.fileno()).st_size
    if size and write_back:
        os.lseek(held.fileno(), 0, os.SEEK_SET)
        while chunk := os.read(held.fileno(), 1 << 16):
            while chunk:
                chunk = chunk[os.write(2, chunk) :]
    if size:
        os.ftruncate(held.fileno(), 0)
    os.lseek(held.fileno(), 0, os.SEEK_SET)


def token_pieces(tokenizer, text: str) -> Iterator[list[int]]:
    """Token ids of `text`, TOKENIZE_CHARS characters at a time at most, each piece cut before a space that
    has a non-space character either side (byte-level BPE then gives the ids of the whole text; a text
    without such a space is cut where the limit falls)."""
    start = 0
    while start < len(text):
        end = min(len(text), start + TOKENIZE_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            while cut > start and (text[cut - 1].isspace() or text[cut + 1].isspace()):
                cut = text.rfind(" ", start + 1, cut)
            end = cut if cut > start else end
        yield encode(tokenizer, text[start:end])
        start = end


def token_ids(tokenizer, text: str, limit: int | None = None) -> tuple[list[int], bool]:
    """(ids, cut): the token ids of `text` (token_pieces), stopping once `limit` are read (None: all), and
    whether text was left untokenized."""
    ids: list[int] = []
    pieces = token_pieces(tokenizer, text)
    for piece in pieces:
        ids.extend(piece)
        if limit is not None and len(ids) >= limit:
            return ids, next(pieces, None) is not None
    return ids, False
