"""The files headlens reads from its own package and the result files it writes: `shipped_path` finds the
resources that ship in headlens/data (the tiny models, the GPT-2 tokenizer, the held-out text, the treebank
sample), so no stage reaches into the loader for a path; `write_atomic` writes so that a crash or a kill never
leaves a torn file."""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path

from headlens.errors import OutputPathError


def shipped_path(name: str) -> Path:
    """The package-data directory of a shipped resource (e.g. "tiny", "gpt2-tokenizer")."""
    return Path(str(resources.files("headlens") / "data" / name))


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to a temp file in the same folder, fsync, then os.replace.

    The old file (if any) survives any failure and the temp file is removed; the new file gets
    the usual umask-based mode (mkstemp alone would leave it 0600). An OSError (unwritable folder,
    full disk, a folder in the way) becomes OutputPathError naming the path.
    """
    path = Path(path)
    try:
        _write(path, text)
    except OutputPathError:
        raise
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
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
