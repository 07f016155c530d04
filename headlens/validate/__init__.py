"""Validate: the from-scratch multi-head attention (headlens.arch.mha) against the library, layer by layer, on
every family (`check`: Hugging Face eager, torch's sdpa on the model's own Q, K, V, and TransformerLens's bridge).

The entry point and its constants are re-exported here, imported when first asked for (headlens.lazy.lazy_getattr).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.lazy import lazy_getattr

if TYPE_CHECKING:  # the names LAZY imports, for type checkers
    from headlens.validate.check import BUILTIN_TEXT, TL_FAMILIES, VALIDATION_ATOL, validate_model

# Public name -> the module of headlens.validate that defines it, imported on first access.
LAZY = {"BUILTIN_TEXT": "check", "TL_FAMILIES": "check", "VALIDATION_ATOL": "check", "validate_model": "check"}

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)

__all__ = ["BUILTIN_TEXT", "TL_FAMILIES", "VALIDATION_ATOL", "validate_model"]
