"""A sweep's rows on disk, so a long run never loses data.

`DIR/manifest.json` records what is being measured (evaluation rule, model, method, metric,
seed, data hash, shape); `DIR/rows.jsonl` gets one JSON line per finished head, written with flush + fsync,
so a kill leaves every finished row intact (a torn last line is dropped on resume). Under
torch.distributed each rank r > 0 appends to its own `DIR/rows.rank<r>.jsonl`; every rows file
is read on resume, one row per head (a head found twice is counted once);
`DIR/sweep.csv` is written (temp file + os.replace) once the sweep completes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from headlens.errors import ConfigError, OutputPathError
from headlens.files import check_target, csv_text, parse_json, read_json, write_atomic
from headlens.heads import Head

# The evaluation rule a store's rows were made under. 1 (no `rule` key): text windows alternated
# between evaluation and reference, mean ablation took a per-position mean, only loss metrics.
# 2: every window evaluated, the reference is the evaluation set (or --reference), position-free
# mean, metric means over scored positions with `n`, `clean`, `ablated`, `delta`.
STORE_RULE = 2
MANIFEST = "manifest.json"
ROWS = "rows.jsonl"
TABLE = "sweep.csv"


def check_sweep_dir(directory, rows_file: str = ROWS) -> Path:
    """`directory` as a Path, or OutputPathError when it is a link or a file, or a file a sweep writes there
    (manifest, rows, table) is not a regular file (headlens.files.check_target). Creates nothing."""
    directory = Path(directory)
    if directory.is_symlink():  # a sweep writes only where it was told, never through a link
        raise OutputPathError(f"--out-dir {directory} is a symlink: give the folder itself, not a link to it")
    if directory.exists() and not directory.is_dir():
        raise OutputPathError(f"--out {directory} is a file: give a directory")
    for name in (MANIFEST, rows_file, TABLE):
        check_target(directory / name)
    return directory


# The fields of a row, each with what it must hold: a count (an integer >= 0), a finite number, or a
# number that may be NaN (a bootstrap interval that could not be drawn)
COUNT, FINITE, NUMBER = "count", "finite", "number"
ROW_FIELDS = {"layer": COUNT, "head": COUNT, "n": COUNT, "clean": FINITE, "ablated": FINITE, "delta": FINITE}
ROW_FIELDS_OPTIONAL = {
    "ci95_low": NUMBER,
    "ci95_high": NUMBER,
    "n_tokens": COUNT,
    "loss": FINITE,
    "loss_ablated": FINITE,
    "delta_loss": FINITE,
}


def _row(line: bytes, shape: tuple[int, int] | None = None) -> dict | None:
    """A rows-file line as the row it holds, or None unless it is what a sweep writes (ROW_FIELDS, each of its
    kind, no other field), with layer and head inside `shape` (n_layers, n_heads) when given. Read by schema, so
    a tampered file cannot carry text (a spreadsheet formula) or a number out of range into sweep.csv."""
    try:
        row = parse_json(line, "row", nan=True)
    except ConfigError:
        return None
    if not isinstance(row, dict) or not ROW_FIELDS.keys() <= row.keys():
        return None
    kinds = {**ROW_FIELDS, **ROW_FIELDS_OPTIONAL}
    if not all(key in kinds and _holds(kinds[key], value) for key, value in row.items()):
        return None
    if shape is not None and not (row["layer"] < shape[0] and row["head"] < shape[1]):
        return None
    return row


def _holds(kind: str, value) -> bool:
    if kind == COUNT:
        return type(value) is int and value >= 0
    number = type(value) in (int, float)
    return number and (kind == NUMBER or math.isfinite(value))


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by an interrupt (Ctrl-C): `n_done` of `n_heads` rows finished, kept in
    `directory` (None: the sweep had no store, nothing was kept)."""

    def __init__(self, n_done: int, n_heads: int, directory: Path | None):
        where = f"saved in {directory}" if directory is not None else "done, none saved (no --out)"
        super().__init__(f"{n_done} of {n_heads} heads {where}")
        self.n_done, self.n_heads, self.directory = n_done, n_heads, directory


class SweepStore:
    """Rows of one sweep in a directory; `done` holds the finished rows, keyed by head."""

    def __init__(self, directory, manifest: dict, resume: bool, rows_file: str = ROWS):
        self.dir = check_sweep_dir(directory, rows_file)
        self.rows_path = self.dir / rows_file  # where this process appends
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(f"cannot create --out directory {self.dir}: {exc.strerror}") from None
        self.manifest = {"rule": STORE_RULE, **manifest}
        self.done: dict[Head, dict] = {}
        existing = self.dir / MANIFEST
        if existing.is_file() or self._rows_files():
            if not resume:
                raise OutputPathError(
                    f"{self.dir} already holds a sweep: pass --resume to continue it, or choose another --out directory"
                )
            self._check_manifest(existing)
            self._read_rows()
        else:
            write_atomic(existing, json.dumps(self.manifest, indent=2, sort_keys=True) + "\n")

    def _check_manifest(self, path: Path) -> None:
        try:
            old = read_json(path, "--resume manifest")
        except ConfigError as exc:
            raise ConfigError(f"{exc}: not a headlens sweep directory") from None
        if not isinstance(old, dict):
            raise ConfigError(f"{path} holds no JSON object: not a headlens sweep directory")
        if old.get("rule") != STORE_RULE:
            raise ConfigError(
                f"--resume {self.dir} was made under an older evaluation rule (store rule "
                f"{old.get('rule', 1)}, now {STORE_RULE}): its rows mean something else; "
                "choose another --out directory"
            )
        diffs = [
            f"{key} {old.get(key)!r} != {value!r}" for key, value in self.manifest.items() if old.get(key) != value
        ]
        if diffs:
            raise ConfigError(
                f"--resume {self.dir} was made with other settings ({'; '.join(diffs)}): "
                "rerun with the same settings or choose another --out directory"
            )

    def _shape(self) -> tuple[int, int] | None:
        """(n_layers, n_heads) of the model the sweep is of, when the manifest says."""
        n_layers, n_heads = self.manifest.get("n_layers"), self.manifest.get("n_heads")
        return (n_layers, n_heads) if isinstance(n_layers, int) and isinstance(n_heads, int) else None

    def _rows_files(self) -> list[Path]:
        return sorted(p for p in self.dir.glob("rows*.jsonl") if p.is_file())

    def _read_rows(self) -> None:
        for path in self._rows_files():
            raw = path.read_bytes()
            good = raw[: raw.rfind(b"\n") + 1]  # a torn last line (killed mid-write) is dropped
            if len(good) != len(raw) and path == self.rows_path:  # only our own file is cut
                with open(path, "r+b") as handle:
                    handle.truncate(len(good))
            for number, line in enumerate(good.split(b"\n")[:-1], 1):
                row = _row(line, self._shape())
                if row is None:
                    raise ConfigError(
                        f"--resume: line {number} of {path} is not a row headlens wrote (JSON with layer and head "
                        "of this model, a count n, finite numbers clean, ablated, delta): the sweep directory is "
                        "damaged; remove that line or choose another --out"
                    )
                self.done.setdefault(Head(row["layer"], row["head"]), row)

    def saved(self, heads) -> int:
        """How many of `heads` have a row on disk now (every rows file, read again)."""
        on_disk = set()
        for path in self._rows_files():
            try:
                lines = path.read_bytes().split(b"\n")[:-1]  # a torn last line is not saved
            except OSError:
                continue
            on_disk.update(Head(row["layer"], row["head"]) for row in map(_row, lines) if row is not None)
        return len(on_disk & set(heads))

    def append(self, row: dict) -> None:
        """Append one finished row durably (flush + fsync)."""
        with open(self.rows_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[Head(row["layer"], row["head"])] = row

    def write_table(self, frame) -> Path:
        path = self.dir / TABLE
        write_atomic(path, csv_text(frame))
        return path
