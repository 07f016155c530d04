"""The shape facts a model file may declare, checked once where a model is opened (a config.json, a
GGUF header) and before anything is allocated or converted: a model file is not trusted.

Layers, heads and widths must be integers within stated bounds (MAX_LAYERS, MAX_HEADS, MAX_WIDTH:
well above the largest open models, far below what would exhaust a machine), key/value heads must
divide the query heads, and without a declared head width the heads must divide the residual width.
Strings from a model file are shown with control characters escaped (`printable`).
"""

from __future__ import annotations

import re
import unicodedata

from headlens.errors import ModelLoadError

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_WIDTH = 2**20  # residual stream, head width, vocabulary, context
SHOWN_CHARS = 100  # how much of an input an error line echoes
_COUNT = re.compile(r"[0-9]{1,30}")  # a count as typed: ASCII digits only (never `²`), never thousands of them


def check_shape(
    where: str,
    n_layers=None,
    n_heads=None,
    d_model=None,
    n_kv_heads=None,
    d_head=None,
) -> None:
    """ModelLoadError naming `where` unless every fact given (None: not declared) is an integer in
    its bounds and the facts agree."""
    facts = {
        "layers": (n_layers, MAX_LAYERS),
        "attention heads": (n_heads, MAX_HEADS),
        "key/value heads": (n_kv_heads, MAX_HEADS),
        "width": (d_model, MAX_WIDTH),
        "head width": (d_head, MAX_WIDTH),
    }
    for name, (value, bound) in facts.items():
        if value is not None and not (type(value) is int and 1 <= value <= bound):
            raise ModelLoadError(
                f"{where} declares {printable(repr(value))[:40]} {name}: expected an integer from 1 to "
                f"{bound:,}; the model file is damaged or hostile"
            )
    if n_heads is not None and n_kv_heads is not None and n_heads % n_kv_heads:
        raise ModelLoadError(f"{where}: {n_kv_heads} key/value heads do not divide {n_heads} attention heads")
    if n_heads is not None and d_model is not None and d_head is None and d_model % n_heads:
        raise ModelLoadError(f"{where}: {n_heads} attention heads do not divide the width {d_model}")


def printable(text: str) -> str:
    """`text` with control and format characters (ESC, BEL, bidi overrides, ...) escaped as \\xNN /
    \\uNNNN, so a string from a model file cannot drive the terminal it is printed on."""
    return "".join(
        char if unicodedata.category(char) not in ("Cc", "Cf") else char.encode("unicode_escape").decode("ascii")
        for char in str(text)
    )


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error line echoes it: its repr, control characters escaped (`printable`), cut to about
    `limit` characters (its start and end, " ... " between), so a long or hostile input never floods the terminal."""
    text = printable(repr(value) if isinstance(value, str) else str(value))
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2  # the start and the end (a path's file name) stay
    return f"{text[:keep]} ... {text[-keep:]}"


def parse_count(text) -> int | None:
    """`text` as a non-negative integer when it is ASCII digits (white space around allowed), else None.
    `str.isdigit` and `int` accept other scripts' digits (`²`, `٣`); this accepts `[0-9]+` alone, at most
    30 digits, so no number typed by a user reaches `int` unchecked."""
    if not isinstance(text, str):
        return None
    match = _COUNT.fullmatch(text.strip())
    return int(match.group()) if match else None
