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
import re
import shutil
import tempfile
from pathlib import Path

from headlens.errors import ModelLoadError
from headlens.files import cache_root  # noqa: F401 (re-exported: the cache's root, defined with the files)

RECORD = "headlens-source.json"  # the entry's record: source facts and file sizes
LAYOUT = 2  # what a converted folder holds; 2: config.json names the model class (`architectures`)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a cache key
_TMP = re.compile(r"\.([0-9a-f]{64})-[A-Za-z0-9_]+")  # a conversion's temporary folder: .KEY-RANDOM


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, links resolved, is `root` (resolved) or lies under it."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


@contextlib.contextmanager
def locked(lock_path: Path, wait: bool = True):
    """An exclusive advisory lock on `lock_path` (created if absent), held for the block; the block
    gets whether it holds the lock (always True when `wait`). The file is removed on release; a
    process that locked a file removed meanwhile locks the new one instead."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(lock_path, "a")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.close()
            yield False
            return
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()  # released and removed by its holder while we waited: lock the file there now
    try:
        yield True
    finally:
        lock_path.unlink(missing_ok=True)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


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
    if not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256)):
        raise ModelLoadError(f"{str(sha256)[:80]!r} is not a sha256 (64 lowercase hex digits): refused as a cache key")
    root = cache_root() / "converted"
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    entry = root / sha256
    record = read_record(entry)
    if record is not None:
        return entry, record
    sweep_killed(root)
    with locked(root / f"{sha256}.lock"):
        record = read_record(entry)  # another process may have finished while we waited
        if record is not None:
            return entry, record
        _remove_entry(entry)  # incomplete or damaged: rebuilt
        tmp = Path(tempfile.mkdtemp(prefix=f".{sha256}-", dir=root))
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


def _remove_entry(entry: Path) -> None:
    """Remove a damaged entry headlens made (a real folder holding its record); a link in its place
    loses only the link. Anything else there is refused, never removed."""
    if entry.is_symlink():
        entry.unlink()
    elif entry.is_dir() and (entry / RECORD).is_file():
        trash = entry.with_name(f".{entry.name}-old{os.getpid()}")  # renamed first: a kill mid-removal leaves
        os.rename(entry, trash)  # a temporary folder that sweep_killed removes, never a half entry
        shutil.rmtree(trash)
    elif entry.exists():
        raise ModelLoadError(
            f"{entry} is in headlens's cache but headlens did not write it (it has no {RECORD}): "
            "move it away and load the model again"
        )


def sweep_killed(root: Path) -> int:
    """Remove the temporary folders (`.KEY-RANDOM`) of conversions killed before they finished: those
    whose key's lock no process holds. The number of folders removed."""
    removed = 0
    for tmp in sorted(root.iterdir()):
        match = _TMP.fullmatch(tmp.name)
        if match is None or tmp.is_symlink() or not tmp.is_dir():
            continue
        with locked(root / f"{match.group(1)}.lock", wait=False) as free:
            if free:
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
    return removed
