"""The files headlens reads from its own package and the result files it writes. `shipped_path` finds the
resources that ship in headlens/data (the tiny models, the GPT-2 tokenizer, the held-out text, the treebank
sample), so no stage reaches into the loader for a path. `write_atomic` writes so that a crash or a kill never
leaves a torn file, and only where a regular file is or none is: an output path that is a device, a FIFO, a
socket, a folder or a symbolic link is refused, never replaced (a link is not written through: it would send the
output wherever the link points). `out_format` reads an `--out FILE`'s format from its suffix, and `write_out`
writes a command's result there as CSV (its table) or JSON (its document): the one writer of every command's
`--out`."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from importlib import resources
from pathlib import Path

from headlens.errors import ConfigError, OutputPathError

# --out FILE: the suffix -> the format written (an HTML page is drawn by headlens.reports, the others by write_out)
OUT_FORMATS = {".csv": "csv", ".json": "json", ".html": "html"}

# st_mode test -> what the thing is, in the words of an error line
_KINDS = (
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


def special_kind(path: str | Path) -> str | None:
    """None when `path` is absent or a regular file; else what it is ("symlink", "directory",
    "character device", "block device", "FIFO", "socket", "special file"). The link itself is
    looked at, not what it points to."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent (a file in the way of a folder is reported later)
        return None
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def check_target(path: str | Path) -> Path:
    """`path`, or OutputPathError when something other than a regular file is there (special_kind)."""
    kind = special_kind(path)
    if kind is not None:
        raise OutputPathError(
            f"output path {path} is a {kind}, not a regular file: headlens writes only regular files "
            "(never through a link, over a device, FIFO, socket or folder); give another path"
        )
    return Path(path)


def out_format(path: str | Path, accepted: tuple[str, ...], option: str = "--out") -> str:
    """The format of an output file, read from its suffix ("csv", "json", "html"); ConfigError in one line
    naming the suffixes this command takes (`accepted`, e.g. (".csv", ".json")) when it is another."""
    suffix = Path(path).suffix.lower()
    if suffix not in accepted or suffix not in OUT_FORMATS:
        found = f"unknown suffix {suffix!r}" if suffix else "no suffix"
        raise ConfigError(f"{option} {path}: {found}; the suffix says the format: {' or '.join(accepted)}")
    return OUT_FORMATS[suffix]


def write_out(path: str | Path, table=None, document=None) -> str:
    """Write a command's result to `path`, atomically, in the format its suffix names: `.csv` the table (a
    DataFrame, without its index), `.json` the document (a JSON-able object, NaN as null). Returns the format."""
    fmt = out_format(path, (".csv", ".json"))
    if fmt == "csv":
        if table is None:
            raise ConfigError(f"--out {path}: this result has no table to write as CSV; give a .json file")
        write_atomic(path, table.to_csv(index=False))
    else:
        write_atomic(path, json.dumps(_nan_as_null(document), indent=2) + "\n")
    return fmt


def _nan_as_null(value):
    """`value` with every float NaN replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {key: _nan_as_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_as_null(item) for item in value]
    return value


def shipped_path(name: str) -> Path:
    """The package-data directory of a shipped resource (e.g. "tiny", "gpt2-tokenizer")."""
    return Path(str(resources.files("headlens") / "data" / name))


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write `text` (str: UTF-8; bytes: as they are) to a temp file in the same folder, fsync, then os.replace.

    The old file (if any) survives any failure and the temp file is removed; the new file gets
    the usual umask-based mode (mkstemp alone would leave it 0600). An OSError (unwritable folder,
    full disk, a folder in the way) becomes OutputPathError naming the path, and so does a target
    that is not a regular file (check_target), before anything is written.
    """
    path = check_target(path)
    try:
        _write(path, text)
    except OutputPathError:
        raise
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_cache_entry(path: Path, data: bytes) -> None:
    """A cache entry under headlens's cache, written by write_atomic with its folder made. One that cannot
    be written is skipped: a cache is never needed for the answer."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
    except (OSError, OutputPathError):
        return


def _write(path: Path, text: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_root() -> Path:
    """headlens's cache folder, read from the environment now: `HEADLENS_CACHE`, else
    `$XDG_CACHE_HOME/headlens`, else `~/.cache/headlens`."""
    if os.environ.get("HEADLENS_CACHE"):
        return Path(os.environ["HEADLENS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "headlens"
