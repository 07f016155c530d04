"""Lazy re-exports (PEP 562), each name written once: a package's `__init__` imports its lazily re-exported names
in its `if TYPE_CHECKING:` block, which type checkers read and which does not run; `lazy_exports` reads that
block from the `__init__`'s source into the `LAZY` table (public name -> the submodule that defines it), and
`lazy_getattr` imports each name from its submodule when first asked for. A core module, so a stage's `__init__`
imports it without reaching back up to the front door (headlens/__init__.py)."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
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


def lazy_exports(package: str, init_file: str) -> dict[str, str]:
    """Public name -> its submodule (below `package`) for every name the top-level `if TYPE_CHECKING:` block of
    `package`'s `__init__` (its source, `init_file`) imports from a submodule of `package`."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    prefix = f"{package}."
    table = {}
    for block in tree.body:
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING":
            for node in block.body:
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
                    table.update({alias.asname or alias.name: node.module[len(prefix) :] for alias in node.names})
    return table
