"""Where a training run lands, so that no folder a user already has is lost.

A run is written into a temporary folder beside its target (`.NAME.*.tmp`, same file system) and renamed
into place only once it is complete: a crash, a kill or an error leaves the target as it was. Every run
holds the marker file MARKER. The target may be absent, empty, or an earlier run (a folder with MARKER:
replaced whole, by two renames); a folder holding anything else is refused unless `force`, which moves the
run's files into it, replacing only the entries of the same names. A link, a file or any other special
file at the target is refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from headlens.bounds import shown
from headlens.errors import OutputPathError
from headlens.files import special_kind

MARKER = ".headlens-train-tiny"  # in every folder `headlens train-tiny` wrote
MARKER_TEXT = "written by headlens train-tiny: a later run with this --out-dir replaces this folder\n"


def check_run_dir(out_dir, force: bool = False) -> Path:
    """`out_dir` as a Path when a run may land there (see the module docstring), else OutputPathError.
    A leading ~ is the home folder, as wherever headlens reads a path (a literal "~" from a quoted argument
    would otherwise create a folder named ~ while the home folder's check never ran). Creates nothing."""
    out_dir = Path(out_dir).expanduser()
    kind = special_kind(out_dir)
    if kind not in (None, "directory"):
        raise OutputPathError(f"--out-dir {shown(str(out_dir))} is a {kind}: give a folder for the training run")
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputPathError(f"--out-dir {shown(str(out_dir))} is a file: give a folder for the training run")
    if out_dir.is_dir() and not force and not is_run(out_dir) and any(out_dir.iterdir()):
        raise OutputPathError(
            f"--out-dir {shown(str(out_dir))} already holds files and is not an earlier train-tiny run: "
            "choose a new or empty folder, or pass --force to write the run's files into it"
        )
    return out_dir


def is_run(folder: Path) -> bool:
    """Whether `folder` holds a run `headlens train-tiny` wrote (its MARKER file)."""
    return (folder / MARKER).is_file()


@contextlib.contextmanager
def staged_run(out_dir, force: bool = False) -> Iterator[Path]:
    """A temporary folder beside `out_dir` (checked: check_run_dir) to write the run into, marked; moved
    into place when the block ends without an error, removed otherwise."""
    out_dir = check_run_dir(out_dir, force)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    except OSError as exc:
        raise OutputPathError(f"cannot create --out-dir {shown(str(out_dir))}: {exc.strerror or exc}") from None
    try:
        (staging / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        yield staging
        _move_into_place(staging, check_run_dir(out_dir, force))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, out_dir: Path) -> None:
    """Absent, empty or an earlier run: `staging` becomes `out_dir` (the earlier run renamed aside first, then
    removed). Otherwise (force): each entry of `staging` replaces the entry of its name in `out_dir`."""
    try:
        if not out_dir.exists() or is_run(out_dir) or not any(out_dir.iterdir()):
            old = None
            if out_dir.exists():
                old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
                os.replace(out_dir, old / "run")
            os.replace(staging, out_dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            return
        for entry in staging.iterdir():
            target = out_dir / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
    except OSError as exc:
        raise OutputPathError(
            f"cannot move the run into --out-dir {shown(str(out_dir))}: {exc.strerror or exc}"
        ) from None
