"""The one shape of headlens's results: a table (`.frame`, a pandas DataFrame) and what it was measured under
(`.meta`, a JSON-ready dict), kept together.

Every stage function returns a `Result`: classify_heads (kind "heads"), sweep_heads ("sweep"), ablate_heads
("ablation"), prune_curve ("pruning"), validate_model ("validation"), the circuits' edge tables,
composition_scores, path_patch and edge_attribution ("edges"), circuit ("circuit"), self_repair
("self_repair"), find_backups ("backups"), approx_sweep ("approx"), spot_check ("spot_check"),
token_ablation ("tokens"), load_training_log ("training"), sample_patterns ("sample") and compare_texts
("agreement"); each function's
docstring gives its frame's columns and its meta's keys. A result of several tables keeps its main one in
`.frame` and the others by name in `.tables` (circuit: `tables["edges"]` and, with an ablation,
`tables["compensation"]`; a training log: `tables["heads"]`); most results have none. The metadata lives
beside the frame, not in pandas' `DataFrame.attrs` (which `pd.concat` and `merge` drop): `pd.concat` refuses
a Result with a TypeError that names `concat_results`, which concatenates the frames and
keeps the metadata, or refuses when it would be lost.

    heads = headlens.classify_heads(loaded)
    heads.frame                      # one row per head
    heads.meta["probes"]["sizes"]    # what the probes ran
    heads.to_json()                  # one JSON document: kind, meta, rows
    heads                            # the last expression of a notebook cell draws it (headlens.view)
    found = headlens.circuit(loaded, task, labels)
    found.frame, found.tables["edges"]  # its heads, its edges
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

KINDS = (
    "heads",
    "sweep",
    "ablation",
    "pruning",
    "validation",
    "edges",
    "circuit",
    "circuit_graph",
    "self_repair",
    "cache",
    "backups",
    "approx",
    "spot_check",
    "tokens",
    "training",
    "sample",
    "agreement",
)


# How a Result draws itself in a notebook: set by the front door (headlens/__init__.py, the one module that may
# reach the reports stage) to headlens.view's HTML fragment, so this core module imports no later stage.
HTML_VIEW: Callable[[Result], str] | None = None


class _ResultType(type):
    """Names `concat_results` in pandas' refusal of a Result ("cannot concatenate object of type <...>")."""

    def __repr__(cls) -> str:
        return f"<class '{cls.__module__}.{cls.__qualname__}': combine results with headlens.concat_results>"


class Result(metaclass=_ResultType):
    """A result table with its metadata. `frame`: the rows (built on first access when given as `rows`, so a
    set ablation does not import pandas until asked); `meta`: what the rows were measured under; `tables`:
    further tables of the same measurement by name (empty unless the producing function documents them)."""

    __slots__ = ("_frame", "_rows", "kind", "meta", "tables")

    def __init__(
        self,
        kind: str,
        frame: pd.DataFrame | None = None,
        meta: dict | None = None,
        *,
        rows=None,
        tables: dict[str, pd.DataFrame] | None = None,
    ):
        if kind not in KINDS:
            raise ValueError(f"unknown result kind {kind!r}: one of {', '.join(KINDS)}")
        if (frame is None) == (rows is None):
            raise ValueError("a Result holds a frame or the rows of one, exactly one of them")
        self.kind = kind  # which stage made it (KINDS)
        self.meta = dict(meta or {})  # JSON-ready facts about the whole table
        self._frame = frame
        self._rows = rows  # list[dict]: the frame's rows, made into a DataFrame on first access
        self.tables = dict(tables or {})  # name -> DataFrame: the measurement's further tables

    @property
    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (schema in the producing function's docstring)."""
        if self._frame is None:
            import pandas as pd  # deferred: a set ablation's result is read as meta, usually

            self._frame = pd.DataFrame(self._rows)
        return self._frame

    def __len__(self) -> int:
        return len(self._rows) if self._frame is None else len(self._frame)

    def __repr__(self) -> str:
        keys = ", ".join(self.meta)
        more = "".join(f"; .tables[{name!r}]: {len(table)} rows" for name, table in self.tables.items())
        return f"<headlens {self.kind} result: {len(self)} rows in .frame{more}; .meta: {keys or 'empty'}>"

    def _repr_html_(self) -> str | None:
        """The inline view (HTML_VIEW: headlens.view's fragment) when a notebook shows the result; None (the
        plain repr) when no view is set."""
        return None if HTML_VIEW is None else HTML_VIEW(self)

    def to_json(self, **dumps: Any) -> str:
        """One JSON document: {"kind", "meta", "rows"}, and "tables" (name -> rows) where the result holds
        further tables; NaN becomes null. `dumps` go to json.dumps."""
        rows = self._rows if self._frame is None else self._frame.to_dict("records")
        document = {"kind": self.kind, "meta": self.meta, "rows": _json_ready(rows)}
        if self.tables:
            document["tables"] = {name: _json_ready(t.to_dict("records")) for name, t in self.tables.items()}
        return json.dumps(document, **dumps)

    def __eq__(self, other: object) -> bool:
        """Same kind, same meta, equal frames and equal further tables."""
        if not isinstance(other, Result):
            return NotImplemented
        same = self.kind == other.kind and self.meta == other.meta and self.frame.equals(other.frame)
        return (
            same
            and self.tables.keys() == other.tables.keys()
            and all(table.equals(other.tables[name]) for name, table in self.tables.items())
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like the DataFrame it holds


def _json_ready(value):
    """`value` with NaN as None and numpy scalars as Python numbers, for json.dumps."""
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    if hasattr(value, "tolist"):  # numpy scalar or array
        return _json_ready(value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def concat_results(results: Sequence[Result]) -> Result:
    """One Result of the rows of `results` (all of one kind, measured under the same meta): the frames
    concatenated in order with a fresh index, the shared meta kept, and each further table likewise.
    TypeError for anything but Results of one kind; ValueError naming the meta keys that differ (two models,
    two probe settings): the combined table would have no single meta to describe it, so keep the results
    apart (or compare their frames yourself, knowing that each one's meta is not carried); ValueError for
    results holding different further tables."""
    import pandas as pd

    results = list(results)
    if not results or not all(isinstance(r, Result) for r in results):
        raise TypeError("concat_results combines headlens Result objects (what the stage functions return)")
    kinds = sorted({r.kind for r in results})
    if len(kinds) > 1:
        raise TypeError(f"concat_results combines results of one kind, got {', '.join(kinds)}")
    first = results[0].meta
    differ = sorted(
        {key for r in results[1:] for key in first.keys() | r.meta.keys() if first.get(key) != r.meta.get(key)}
    )
    if differ:
        raise ValueError(
            f"these {kinds[0]} results were measured under different metadata ({', '.join(differ)}); "
            "one table would lose it, so concat_results keeps them apart"
        )
    if any(r.tables.keys() != results[0].tables.keys() for r in results):
        raise ValueError(f"these {kinds[0]} results hold different further tables, so concat_results keeps them apart")
    frame = pd.concat([r.frame for r in results], ignore_index=True)
    tables = {name: pd.concat([r.tables[name] for r in results], ignore_index=True) for name in results[0].tables}
    return Result(kinds[0], frame, first, tables=tables)
