"""Lazy re-exports (PEP 562): a package names its public names and the submodules that define them in a
`LAZY` table, and `lazy_getattr` imports each from its submodule when first asked for. A core module, so a
stage's `__init__` imports it without reaching back up to the front door (headlens/__init__.py)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` (PEP 562) of a package whose `table` (public name -> its submodule) names
    what it re-exports lazily: a name is imported from its submodule on first access and then kept in the
    package, so `from package import name` works and importing one submodule loads only what it imports."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups find it without this hook
        return value

    return __getattr__
