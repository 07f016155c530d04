"""The files headlens reads from its own package and the result files it writes. `shipped_path` finds the
resources that ship in headlens/data (the tiny models, the GPT-2 tokenizer, the held-out text, the treebank
sample), so no stage reaches into the loader for a path. `write_atomic` writes so that a crash or a kill never
leaves a torn file, and only where a regular file is or none is: an output path that is a device, a FIFO, a
socket, a folder or a symbolic link is refused, never replaced (a link is not written through: it would send the
output wherever the link points)."""

from __future__ import annotations

import os
import stat
import tempfile
from importlib import resources
from pathlib import Path

from headlens.errors import OutputPathError

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
