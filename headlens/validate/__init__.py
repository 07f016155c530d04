"""Validate: the from-scratch multi-head attention (headlens.arch.mha) against the library, layer by layer, on
every family (`check`: Hugging Face eager, torch's sdpa on the model's own Q, K, V, and TransformerLens's bridge).

The entry point and its constants are re-exported here, imported when first asked for (headlens.lazy.lazy_getattr).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.lazy import lazy_exports, lazy_getattr

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.validate.check import BUILTIN_TEXT, TL_FAMILIES, VALIDATION_ATOL, validate_model

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)

__all__ = sorted([*LAZY])
