"""Tokenizing text of any length in bounded memory: a tokenizer's memory grows with its input (tens of bytes
per character), so a long text is tokenized piece by piece (`token_pieces`) and only as far as a reader
needs (`token_ids`); `encode` turns a tokenizer that cannot finish (a Rust panic) into one error line."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

from headlens.errors import InputTextError

# Characters of a text tokenized in one call: a tokenizer's memory grows with its input (tens of bytes per
# character), so a long text is tokenized piece by piece and only as far as a reader needs
TOKENIZE_CHARS = 1 << 18


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` (no special tokens). A tokenizer whose pattern cannot finish on this text (a
    hostile tokenizer.json regex exhausting Oniguruma's retry limit: the Rust tokenizer panics) is
    InputTextError, and the panic's own lines are kept off the terminal (rust_quiet)."""
    with rust_quiet() as panicked:
        try:
            return tokenizer(text, add_special_tokens=False)["input_ids"]
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            if type(exc).__name__ != "PanicException":
                raise
            panicked.append(exc)
    raise InputTextError(
        "the model's tokenizer failed on this text (its pre-tokenizer pattern gave up: "
        f"{str(panicked[0])[:80]}): the tokenizer files are damaged or hostile"
    )


@contextlib.contextmanager
def rust_quiet():
    """While the block runs, stderr (file descriptor 2) goes to a temporary file; what was written there is
    written back to stderr afterwards unless the block appended to the list it receives (a panic: Rust's
    panic hook prints its own lines, which a one-line error must not be followed by)."""
    panicked: list = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield panicked
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                held.seek(0)
                os.write(2, held.read())


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
