"""The shape facts a model file may declare, checked once where a model is opened (a config.json, a
GGUF header) and before anything is allocated or converted: a model file is not trusted.

Layers, heads and widths must be integers within stated bounds (MAX_LAYERS, MAX_HEADS, MAX_WIDTH:
well above the largest open models, far below what would exhaust a machine), key/value heads must
divide the query heads, and without a declared head width the heads must divide the residual width.
Strings from a model file are shown with control characters escaped (`printable`).
"""

from __future__ import annotations

import unicodedata

from headlens.errors import ModelLoadError

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_WIDTH = 2**20  # residual stream, head width, vocabulary, context


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
