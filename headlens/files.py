"""The files headlens reads from its own package and the result files it writes. `shipped_path` finds the
resources that ship in headlens/data (the tiny models, the GPT-2 tokenizer, the held-out text, the treebank
sample), so no stage reaches into the loader for a path. `write_atomic` writes so that a crash or a kill never
leaves a torn file, and only where a regular file is or none is: an output path that is a device, a FIFO, a
socket, a folder or a symbolic link is refused, never replaced (a link is not written through: it would send the
output wherever the link points). `read_json` is the one way headlens reads a JSON file it is handed (a regular
file under a size cap, any parse failure one error line), and `csv_text` the one way it writes a CSV (cells
that a spreadsheet would run as a formula are escaped)."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from importlib import resources
from pathlib import Path

from headlens.bounds import shown
from headlens.errors import ConfigError, HeadlensError, OutputPathError

MAX_JSON_BYTES = 64 << 20  # a JSON file headlens reads: larger is refused before it is read
# A CSV cell a spreadsheet runs as a formula begins with one of these (OWASP, "CSV Injection")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|nan)", re.IGNORECASE)

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


def parse_json(raw: bytes | str, where: str, error: type[HeadlensError] = ConfigError, nan: bool = False):
    """The JSON value in `raw`, or `error` in one line naming `where`: not UTF-8, not JSON, NaN or Infinity
    (not JSON; with `nan`, NaN is read, as Python's json writes a missing number), a float beyond the
    range of floats, nested too deeply for the parser (RecursionError) or an integer too long to convert."""
    constant = _nan_only if nan else _no_constant
    try:
        return json.loads(raw, parse_constant=constant, parse_float=_finite)
    except UnicodeDecodeError as exc:
        raise error(f"{where} is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise error(f"{where} nests too deeply to be read as JSON") from None
    except ValueError as exc:  # an integer of thousands of digits; NaN / Infinity (_no_constant)
        raise error(f"{where} is not valid JSON: {str(exc)[:80]}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _nan_only(name: str) -> float:
    if name != "NaN":
        _no_constant(name)
    return math.nan


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a float")
    return value


def read_json(path: str | Path, what: str, error: type[HeadlensError] = ConfigError, limit: int = MAX_JSON_BYTES):
    """The JSON value of the file `path` (`what` names it in an error line: "--labels"), or `error`: not a
    regular file, larger than `limit` bytes or unreadable (read_capped), or not JSON (parse_json)."""
    return parse_json(read_capped(path, what, error, limit), f"{what} {shown(str(path))}", error)


def read_capped(path: str | Path, what: str, error: type[HeadlensError] = ConfigError, limit: int = MAX_JSON_BYTES):
    """The bytes of the file `path`, or `error` naming it (`what`: "--labels"): not a regular file (a FIFO, a
    device such as /dev/zero, a folder: refused before it is opened, so nothing hangs or reads forever),
    larger than `limit` bytes, or unreadable."""
    where = f"{what} {shown(str(path))}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} file not found: {shown(str(path))}") from None
    except OSError as exc:
        raise error(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{where} is not a regular file: give a file")
    if info.st_size > limit:
        raise error(f"{where} is {info.st_size:,} bytes, more than the {limit:,} it may have")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise error(f"{where} is more than the {limit:,} bytes it may have")
    return raw


def csv_text(frame) -> str:
    """`frame` as CSV text (no index), every text cell that begins as a spreadsheet formula would (= + - @,
    tab, carriage return) prefixed with a single quote (OWASP's advice), so a value that came from a file
    cannot run in the spreadsheet that opens the table. Numbers, and text that is a plain number
    ("-0.5"), are written as they are."""
    escaped = {
        column: frame[column].map(_escape_cell)
        for column in frame.columns
        if frame[column].dtype.kind not in "biufc"  # numbers and booleans are written as they are
    }
    return frame.assign(**escaped).to_csv(index=False) if escaped else frame.to_csv(index=False)


def _escape_cell(value):
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value
