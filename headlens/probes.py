"""Probe inputs: repeated random tokens (Olsson et al.), natural-text windows, needles."""

from __future__ import annotations

import torch


def repeated_random_tokens(n_seq: int, seq_len: int, repeats: int, low: int, high: int,
                           bos_id: int | None, seed: int = 0) -> torch.Tensor:
    """Random token ids in [low, high) of period `seq_len`, repeated `repeats` times, BOS prepended.

    Olsson et al. 2022: 25 random tokens (most and least common excluded), repeated 4 times,
    BOS prepended. The id range [low, high) is how the caller excludes rare and common
    tokens. Returns [n_seq, 1 + seq_len * repeats] (without BOS when bos_id is None).
    """
    gen = torch.Generator().manual_seed(seed)
    period = torch.randint(low, high, (n_seq, seq_len), generator=gen)  # [n_seq, seq_len]
    body = period.repeat(1, repeats)  # [n_seq, seq_len * repeats]
    if bos_id is None:
        return body
    bos = torch.full((n_seq, 1), bos_id, dtype=torch.long)  # [n_seq, 1]
    return torch.cat([bos, body], dim=1)  # [n_seq, 1 + seq_len * repeats]


# Natural text ---------------------------------------------------------------------------

# Share of NUL / control bytes above which a file is taken for binary, not text.
_BINARY_CONTROL_SHARE = 0.01
DEFAULT_TEXT_NAME = "heldout.txt"  # held-out evaluation text shipped beside the tiny model


def read_text(path) -> str:
    """Read a UTF-8 text file; InputTextError for missing, empty, binary or non-UTF-8 files."""
    from pathlib import Path

    from headlens.errors import InputTextError

    path = Path(path)
    if not path.is_file():
        raise InputTextError(f"text file not found: {path}")
    raw = path.read_bytes()
    return check_text(raw, str(path))


def check_text(raw: bytes | str, where: str = "text") -> str:
    """Validate text given as bytes or str: non-empty, UTF-8, not binary."""
    from headlens.errors import InputTextError

    if isinstance(raw, bytes):
        if b"\x00" in raw:
            raise InputTextError(f"{where} looks binary (contains NUL bytes): give a UTF-8 text file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputTextError(f"{where} is not valid UTF-8 (byte {exc.start}): give a UTF-8 text file") from None
    else:
        text = raw
    if not text.strip():
        raise InputTextError(f"{where} is empty")
    control = sum(1 for ch in text if ord(ch) < 32 and ch not in "\n\r\t\f")
    if control > _BINARY_CONTROL_SHARE * len(text):
        raise InputTextError(f"{where} looks binary ({control} control characters): give a UTF-8 text file")
    return text


def default_text() -> str:
    """The held-out evaluation text shipped with the embedded model."""
    from headlens.models import shipped_path

    return read_text(shipped_path("tiny") / DEFAULT_TEXT_NAME)


def text_windows(tokenizer, text: str, window: int, bos_id: int | None, min_tokens: int = 2,
                 max_windows: int | None = None) -> list[list[int]]:
    """Tokenize `text` and cut it into consecutive windows of at most `window` tokens, each with
    BOS prepended (BOS counts towards `window`). Never truncates silently: every token lands in
    a window (up to `max_windows`, which the caller states). The last window may be shorter;
    it is dropped only if it has fewer than `min_tokens` text tokens.
    """
    from headlens.errors import InputTextError

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    body = window - (1 if bos_id is not None else 0)
    if body < 1:
        raise InputTextError(f"window of {window} tokens leaves no room for text")
    windows = []
    for start in range(0, len(ids), body):
        chunk = ids[start : start + body]
        if len(chunk) < min_tokens:
            continue
        windows.append(([bos_id] if bos_id is not None else []) + chunk)
        if max_windows is not None and len(windows) >= max_windows:
            break
    if not windows:
        raise InputTextError(f"text is too short: {len(ids)} tokens, need at least {min_tokens}")
    return windows
