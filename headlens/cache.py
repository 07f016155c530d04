"""headlens's cache: what headlens computes once per model and keeps, in one place with one key, one writer,
one version policy and one size limit.

Root: headlens.files.cache_root. Each kind of thing kept (VERSION) has a folder there, and each entry is a folder
`<root>/<kind>/<key>/` holding its files and its record (RECORD, written last: kind, version, model, every file
with its size). An entry is complete when its record reads back, names today's VERSION of its kind and lists
every file with its size; an incomplete or damaged one is computed again and replaced. An entry is built in a
temporary folder beside it (`.KEY-RANDOM`), its files written by headlens.files.write_atomic, under a per-key
file lock, and renamed into place, so a reader never sees half an entry and two processes never build one twice.

Keys: `key(kind, digest, **facts)`, the sha256 of the kind, its VERSION, the weights' digest (the caller's
`loaded.digest()`, or a GGUF file's sha256 for the converted folders) and the facts the entry depends on. The
version policy: VERSION[kind] goes up whenever what a kind stores, or what computes it, changes; older entries
are never read again and leave by eviction or `headlens cache clear`.

Size: reading an entry marks it used (its folder's mtime); after each write the least recently used entries
are evicted until all of them fit in HEADLENS_CACHE_MAX_GB (DEFAULT_MAX_GB). Only headlens's own entries are
ever removed (a folder named by a key, inside a kind's folder, holding headlens's record; a link in an entry's
place loses only the link), never an entry another process is building, nor one just written or read here.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from headlens.errors import CacheEntryError, ConfigError, OutputPathError
from headlens.files import cache_root, write_atomic
from headlens.results import Result

# kind -> the version of what its entries hold; raise it when that changes (the module docstring).
VERSION = {
    "converted": 2,  # a GGUF dequantized to a Hugging Face float32 folder (config.json naming the model class)
    "classify": 3,  # the default classification's records: raised with vocab-criteria when a score changes
    "vocab-criteria": 3,  # copy suppression's OV and QK criteria over the vocabulary, as tensors
    "clean-runs": 1,  # a clean run's metric values at every scored position of an evaluation set
}
RECORD = "headlens-entry.json"  # an entry's record, written last
DATA = "data"  # the file of a one-file entry
MAX_GB_ENV = "HEADLENS_CACHE_MAX_GB"
DEFAULT_MAX_GB = 20.0
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_TMP = re.compile(r"\.([0-9a-f]{64})-[A-Za-z0-9_]+")  # a temporary folder: .KEY-RANDOM


@dataclass(frozen=True)
class Entry:
    """One entry as `entries` finds it."""

    kind: str  # a key of VERSION
    key: str  # 64 hex digits
    path: Path  # its folder
    size: int  # bytes of its files, record included
    used: float  # when it was last written or read (its folder's mtime, seconds since the epoch)
    model: str  # the model it was computed for, as its record names it ("" when unknown)


def key(kind: str, digest: str, **facts) -> str:
    """The key of `kind`'s entry for weights with `digest` under `facts` (JSON-ready values)."""
    named = {"kind": kind, "version": VERSION[kind], "digest": digest, "facts": facts}
    text = json.dumps(named, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def get(kind: str, entry_key: str, name: str = DATA) -> bytes | None:
    """The bytes of file `name` of a complete entry (then marked used), else None."""
    path = _path(kind, entry_key)
    if _read_record(path, kind) is None:
        return None
    try:
        data = (path / name).read_bytes()
    except OSError:
        return None
    _touch(path)
    return data


def put(kind: str, entry_key: str, data: bytes, model: str = "", name: str = DATA) -> None:
    """Keep `data` as a one-file entry (replacing the one there, which its reader found damaged), then evict
    down to the size limit. An entry that cannot be written is skipped: a cache is never needed for the
    answer."""

    def write(folder: Path) -> dict:
        write_atomic(folder / name, data)
        return {}

    with contextlib.suppress(OSError, OutputPathError, CacheEntryError):
        build(kind, entry_key, write, model=model, wait=False, replace=True)


def build(
    kind: str,
    entry_key: str,
    write: Callable[[Path], dict],
    model: str = "",
    wait: bool = True,
    replace: bool = False,
) -> tuple[Path, dict]:
    """The folder of a complete entry and its record: the one there (marked used), else (or, with `replace`,
    always) built now by `write(folder)`, which writes the files and returns facts for the record. Under the
    key's lock; with `wait` False a build already under way elsewhere is left to it (OSError)."""
    path = _path(kind, entry_key)
    record = None if replace else _read_record(path, kind)
    if record is not None:
        _touch(path)
        return path, record
    sweep_killed(path.parent)
    with locked(path.parent / f"{entry_key}.lock", wait=wait) as held:
        if not held:
            raise OSError(f"{path} is being written by another process")
        record = None if replace else _read_record(path, kind)  # another process may have finished meanwhile
        if record is None:
            record = _build(path, kind, write, model)
    evict(keep={path})
    return path, record


def _build(path: Path, kind: str, write: Callable[[Path], dict], model: str) -> dict:
    remove_entry(path)  # incomplete or damaged: built again
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        record = {"model": model, **write(tmp), "kind": kind, "version": VERSION[kind]}
        record["files"] = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        write_atomic(tmp / RECORD, json.dumps(record, indent=1))
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _path(kind: str, entry_key: str) -> Path:
    """The entry's folder (its kind's folder made); the size limit is checked here, before any work."""
    max_bytes()
    if kind not in VERSION or not (isinstance(entry_key, str) and SHA256_HEX.fullmatch(entry_key)):
        raise ValueError(f"not a cache entry: kind {kind!r}, key {str(entry_key)[:80]!r}")
    folder = cache_root() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve() / entry_key


def _read_record(path: Path, kind: str) -> dict | None:
    """The entry's record when it is today's version of `kind` and every file it lists has its size."""
    try:
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        sizes = record["files"]
        if (
            record.get("kind") == kind
            and record.get("version") == VERSION[kind]
            and sizes
            and all((path / name).stat().st_size == size for name, size in sizes.items())
        ):
            return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def remove_entry(path: Path) -> None:
    """Remove an entry headlens made (a real folder holding its record); a link in its place loses only
    the link. Anything else there is refused (CacheEntryError), never removed."""
    if path.is_symlink():
        path.unlink()
    elif path.is_dir() and (path / RECORD).is_file():
        trash = path.with_name(f".{path.name}-old{os.getpid()}")  # renamed first: a kill mid-removal leaves
        os.rename(path, trash)  # a temporary folder that sweep_killed removes, never a half entry
        shutil.rmtree(trash)
    elif path.exists():
        raise CacheEntryError(
            f"{path} is in headlens's cache but headlens did not write it (it has no {RECORD}): "
            "move it away and run again"
        )


@contextlib.contextmanager
def locked(lock_path: Path, wait: bool = True) -> Iterator[bool]:
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


def sweep_killed(folder: Path) -> int:
    """Remove the temporary folders (`.KEY-RANDOM`) of builds killed before they finished: those whose
    key's lock no process holds. The number of folders removed."""
    removed = 0
    for tmp in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _TMP.fullmatch(tmp.name)
        if match is None or tmp.is_symlink() or not tmp.is_dir():
            continue
        with locked(folder / f"{match.group(1)}.lock", wait=False) as free:
            if free:
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
    return removed


def entries(kind: str | None = None) -> list[Entry]:
    """headlens's entries under the cache root (of `kind`, else of every kind), least recently used first."""
    found = []
    for each in [kind] if kind is not None else sorted(VERSION):
        folder = cache_root().resolve() / each  # resolved as build's paths are (`keep` in evict)
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            entry = _entry(each, path)
            if entry is not None:
                found.append(entry)
    return sorted(found, key=lambda e: (e.used, e.kind, e.key))


def _entry(kind: str, path: Path) -> Entry | None:
    """`path` as an Entry when it is one of headlens's (a real folder named by a key holding RECORD)."""
    if not SHA256_HEX.fullmatch(path.name) or path.is_symlink() or not (path / RECORD).is_file():
        return None
    try:
        files = [p for p in path.iterdir() if p.is_file() and not p.is_symlink()]
        size = sum(p.stat().st_size for p in files)
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        model = str(record.get("model", "")) if isinstance(record, dict) else ""
        return Entry(kind, path.name, path, size, path.stat().st_mtime, model)
    except (OSError, ValueError):
        return Entry(kind, path.name, path, 0, 0.0, "")  # damaged: still headlens's, removed first


def max_bytes() -> int:
    """The size limit: HEADLENS_CACHE_MAX_GB (gigabytes, 10^9 bytes) read now, else DEFAULT_MAX_GB."""
    text = os.environ.get(MAX_GB_ENV, "").strip()
    try:
        limit = float(text) if text else DEFAULT_MAX_GB
    except ValueError:
        limit = -1.0
    if not limit >= 0 or limit == float("inf"):
        raise ConfigError(f"{MAX_GB_ENV}={text!r} is not a size in gigabytes: give a number >= 0 (e.g. 20)")
    return int(limit * 1e9)


def evict(keep: set[Path] = frozenset(), limit: int | None = None) -> list[Entry]:
    """Remove least recently used entries (never those in `keep`, nor one being built) until the rest fit
    in `limit` bytes (max_bytes). The entries removed."""
    limit = max_bytes() if limit is None else limit
    found = entries()
    total = sum(e.size for e in found)
    removed = []
    for entry in found:
        if total <= limit:
            break
        if entry.path not in keep and _remove_free(entry):
            total -= entry.size
            removed.append(entry)
    return removed


def clear(kind: str | None = None) -> list[Entry]:
    """Remove every entry (of `kind`, else of every kind) that no process is building, and the temporary
    folders of killed builds. The entries removed."""
    removed = [entry for entry in entries(kind) if _remove_free(entry)]
    for each in [kind] if kind is not None else sorted(VERSION):
        sweep_killed(cache_root() / each)
    return removed


def _remove_free(entry: Entry) -> bool:
    """Remove `entry` unless its key's lock is held elsewhere (being built); whether it was removed."""
    with locked(entry.path.parent / f"{entry.key}.lock", wait=False) as free:
        if free and _entry(entry.kind, entry.path) is not None:
            with contextlib.suppress(OSError):
                remove_entry(entry.path)
                return True
    return False


def usage(kind: str | None = None) -> Result:
    """What the cache keeps (of `kind`, else of every kind), as a Result of kind "cache": one row per kind
    and model (`kind`, `model`, `entries`, `bytes`, `last_used` as ISO 8601 UTC), sorted by kind and model;
    meta: `root`, `max_bytes` (the size limit) and `total_bytes`."""
    groups: dict[tuple[str, str], list[Entry]] = {}
    for entry in entries(kind):
        groups.setdefault((entry.kind, entry.model), []).append(entry)
    rows = [
        {
            "kind": each,
            "model": model,
            "entries": len(group),
            "bytes": sum(e.size for e in group),
            "last_used": datetime.fromtimestamp(max(e.used for e in group), UTC).isoformat(timespec="seconds"),
        }
        for (each, model), group in sorted(groups.items())
    ]
    total = sum(row["bytes"] for row in rows)
    meta = {"root": str(cache_root()), "max_bytes": max_bytes(), "total_bytes": total}
    return Result("cache", rows=rows, meta=meta)
