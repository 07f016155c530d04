"""Corpora: a text file, a folder of `.txt` files, or a JSON Lines file with a `text` field,
read one document at a time.

`Corpus(path)` checks the whole corpus first, streaming (every file UTF-8 and not binary, every
JSON line an object with a string `text`), so a bad line fails in one clear line before any
model work, and counts the documents for a progress bar. Iterating then yields the documents
one by one; no more than one document is held at a time. `TextFile(path)` reads one plain text
file the same way, in pieces of about PIECE_BYTES cut after a line end, so memory does not grow
with the file; a reader may stop once it has what it needs (`streamed`). `document_windows` cuts
the stream into the model-sized token windows classify scores, document by document.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm.auto import tqdm

from headlens.errors import InputTextError
from headlens.files import parse_json
from headlens.probes.inputs import MIN_TEXT_TOKENS, check_text, read_text, text_windows
from headlens.probes.tokenize import token_ids

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PIECE_BYTES = 1 << 20  # a plain text file is read in pieces of about this size (a file up to it: one piece)
TEXT_FIELD = "text"  # the field of each JSON line that holds the document


class Corpus:
    """The documents under `path`, in a fixed order (a folder's `.txt` files sorted by path,
    recursively; a JSON Lines file's lines in order; a text file is one document)."""

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            self.kind = "folder"
            self.files = sorted(p for p in self.path.rglob("*.txt") if p.is_file())
            if not self.files:
                raise InputTextError(f"folder {self.path} holds no .txt files")
        elif self.path.is_file():
            self.kind = "jsonl" if self.path.suffix.lower() in JSONL_SUFFIXES else "file"
            self.files = [self.path]
        else:
            raise InputTextError(f"text not found: {self.path} (give a text file, a folder of .txt files or a .jsonl)")
        self.n_documents = sum(1 for _ in self._documents(check=True))
        if self.n_documents == 0:
            raise InputTextError(f"{self.path} holds no documents with text")

    def __len__(self) -> int:
        return self.n_documents

    def __iter__(self) -> Iterator[str]:
        return self._documents(check=False)

    def _documents(self, check: bool) -> Iterator[str]:
        if self.kind == "jsonl":
            yield from _jsonl_documents(self.path, check)
            return
        for file in self.files:
            text = _read_document(file, check, skip_empty=self.kind == "folder")
            if text is not None:
                yield text


class TextFile:
    """A plain UTF-8 text file as documents: its pieces of about PIECE_BYTES, each cut after a line end
    that has no white space either side (_cut); windows never span two pieces, and a file up to
    PIECE_BYTES is one document, its whole text. Checked whole first, streaming, as Corpus is (UTF-8,
    no NUL, not binary, some text). `streamed`: a reader that has what it needs stops reading
    (document_windows)."""

    streamed = True

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputTextError(f"text file not found: {self.path}")
        self.n_documents = sum(1 for _ in self._pieces(check=True))
        if self.n_documents == 0:
            check_text(self.path.read_bytes()[:PIECE_BYTES], str(self.path))  # empty or white space: its error
            raise InputTextError(f"{self.path} holds only white space: give some text")

    def __len__(self) -> int:
        return self.n_documents

    def __iter__(self) -> Iterator[str]:
        return self._pieces(check=False)

    def _pieces(self, check: bool) -> Iterator[str]:
        decoder, carry, read = codecs.getincrementaldecoder("utf-8")(), "", 0
        with self.path.open("rb") as handle:
            while raw := handle.read(PIECE_BYTES):
                if check and b"\x00" in raw:
                    raise InputTextError(f"{self.path} looks binary (contains NUL bytes): give a UTF-8 text file")
                try:
                    text = carry + decoder.decode(raw)
                except UnicodeDecodeError as exc:
                    where = f"byte {read + exc.start}"
                    raise InputTextError(f"{self.path} is not valid UTF-8 ({where}): give a UTF-8 text file") from None
                read += len(raw)
                cut = _cut(text)
                if cut == 0 and len(text) < 4 * PIECE_BYTES:  # no line end yet: read on (a line of 4 pieces is cut)
                    carry = text
                    continue
                piece, carry = (text[:cut], text[cut:]) if cut else (text, "")
                yield from self._checked(piece, check)
        yield from self._checked(carry + decoder.decode(b"", final=True), check)

    def _checked(self, piece: str, check: bool) -> Iterator[str]:
        if piece.strip():
            yield check_text(piece, str(self.path)) if check else piece


def _cut(text: str) -> int:
    """Where to end a piece of `text`: after its last line end with a non-space character either side
    (byte-level BPE tokenizers, GPT-2's and Llama 3's, then tokenize the pieces as the whole text), 0
    when there is none."""
    end = len(text) - 1
    while (newline := text.rfind("\n", 1, end)) > 0:
        if not (text[newline - 1].isspace() or text[newline + 1].isspace()):
            return newline + 1
        end = newline
    return 0


def open_text(path, stream: bool = False) -> str | Corpus | TextFile:
    """What `--text PATH` means on every command: a folder or a JSON Lines file as a Corpus
    (documents streamed), a text file as its text, or with `stream` as a TextFile (read in pieces)."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() in JSONL_SUFFIXES:
        return Corpus(path)
    return TextFile(path) if stream else read_text(path)


def first_document(text: str | Corpus | None) -> str | None:
    """One text out of `open_text`'s answer, for what reads a single text (validation, the report's
    viewer sample): a text as it is, a corpus's first document."""
    if text is None or isinstance(text, str):
        return text
    return next(iter(text))


def _read_document(file: Path, check: bool, skip_empty: bool) -> str | None:
    """One text file: checked (probes.check_text) on the first pass; an empty file in a folder
    is skipped (None), a lone empty file is an error."""
    raw = file.read_bytes()
    if skip_empty and not raw.strip():
        return None
    return check_text(raw, str(file)) if check else raw.decode("utf-8")


def _jsonl_documents(path: Path, check: bool) -> Iterator[str]:
    """The `text` of each non-blank line of a JSON Lines file, read line by line."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            record = parse_json(raw, where, InputTextError)
            if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
                raise InputTextError(
                    f"{where} has no string {TEXT_FIELD!r} field: each line must be an object "
                    f'like {{"{TEXT_FIELD}": "..."}}'
                )
            text = record[TEXT_FIELD]
            if not text.strip():
                continue
            yield check_text(text, where) if check else text


def document_windows(
    tokenizer,
    documents: Iterable[str],
    n_ctx: int,
    bos: int | None,
    max_windows: int,
    facts: dict,
    haystack: list[int],
    progress: bool = False,
    haystack_len: int | None = None,
) -> Iterator[list[int]]:
    """Stream each document's text windows (probes.text_windows: BOS + up to n_ctx - 1 tokens, never
    spanning two documents) until `max_windows`, counting every document's tokens and windows in
    `facts` (n_documents, n_text_tokens, n_windows_available, n_windows, longest_window); the first documents'
    tokens, whole, until `haystack_len` (default n_ctx) are reached, go into `haystack`. A document is
    tokenized in pieces and only as far as the windows and the haystack still need (probes.token_ids;
    `text_partly_read` when text was left). A progress bar over documents and tokens when asked."""
    body = n_ctx - 1
    haystack_len = n_ctx if haystack_len is None else haystack_len
    total = len(documents) if hasattr(documents, "__len__") else None
    bar = tqdm(total=total, desc="text", unit="doc", leave=False) if progress else None
    streamed = getattr(documents, "streamed", False)
    for document in documents:
        if streamed and facts["n_windows"] >= max_windows and len(haystack) >= haystack_len:
            facts["text_partly_read"] = True  # a TextFile: the rest is not tokenized
            break
        need = max(max_windows - facts["n_windows"], 0) * body + max(haystack_len - len(haystack), 0)
        ids, cut = token_ids(tokenizer, document, max(need, 1))  # a long document: only as far as needed
        if cut:
            facts["text_partly_read"] = True  # counts below are of the part read
        if facts["n_documents"] == 0 or len(haystack) < haystack_len:
            haystack.extend(ids)
        facts["n_documents"] += 1
        facts["n_text_tokens"] += len(ids)
        facts["n_windows_available"] += -(-len(ids) // body)
        left = max_windows - facts["n_windows"]
        if left > 0 and len(ids) >= MIN_TEXT_TOKENS:
            for window in text_windows(tokenizer, ids, n_ctx, bos, min_tokens=MIN_TEXT_TOKENS, max_windows=left):
                facts["n_windows"] += 1
                facts["longest_window"] = max(facts.get("longest_window", 0), len(window))
                yield window
        if bar is not None:
            bar.update(1)
            bar.set_postfix(tokens=facts["n_text_tokens"], windows=facts["n_windows"])
    if bar is not None:
        bar.close()


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """Lists of `size` consecutive items of an iterator (the last may be shorter)."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
