"""headlens's cache: pulled GGUF files and, keyed by each GGUF's sha256, the Hugging Face folder of
float32 weights it was dequantized into once.

Root: `HEADLENS_CACHE`, else `$XDG_CACHE_HOME/headlens`, else `~/.cache/headlens`. An entry is
built in a temporary folder beside it and renamed into place, under a per-key file lock, so two
processes converting the same GGUF at once both end up reading one complete entry. An entry is
complete when its record (written last) lists every file with its size; one that is not (a
crash, a truncated or deleted file) or that an older layout wrote (its record's `layout` differs
from LAYOUT) is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from headlens.errors import ModelLoadError

RECORD = "headlens-source.json"  # the entry's record: source facts and file sizes
LAYOUT = 2  # what a converted folder holds; 2: config.json names the model class (`architectures`)


def cache_root() -> Path:
    """The cache folder, read from the environment now."""
    if os.environ.get("HEADLENS_CACHE"):
        return Path(os.environ["HEADLENS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "headlens"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(lock_path: Path):
    """An exclusive advisory lock on `lock_path` (created if absent), held for the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def read_record(entry: Path) -> dict | None:
    """The entry's record when it has today's LAYOUT and every file it lists is present with its
    recorded size, else None."""
    try:
        record = json.loads((entry / RECORD).read_text(encoding="utf-8"))
        sizes = record["files"]
        if (
            record.get("layout") == LAYOUT
            and all((entry / name).stat().st_size == size for name, size in sizes.items())
            and sizes
        ):
            return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def converted_entry(sha256: str, build) -> tuple[Path, dict]:
    """The cache folder of the model whose GGUF has `sha256`, and its record. The first time (and
    again when the entry is incomplete) `build(folder)` writes the files and returns the source
    facts for the record."""
    root = cache_root() / "converted"
    entry = root / sha256
    record = read_record(entry)
    if record is not None:
        return entry, record
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f"{sha256}.lock"):
        record = read_record(entry)  # another process may have finished while we waited
        if record is not None:
            return entry, record
        shutil.rmtree(entry, ignore_errors=True)  # incomplete or damaged: rebuilt
        tmp = Path(tempfile.mkdtemp(prefix=f".{sha256[:16]}-", dir=root))
        try:
            record = dict(build(tmp), sha256=sha256, layout=LAYOUT)
            record["files"] = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            (tmp / RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
            os.replace(tmp, entry)
        except ModelLoadError:
            raise
        except OSError as exc:
            raise ModelLoadError(f"cannot write the converted model into {root}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry, record
