"""The converted kind of headlens's cache (headlens.cache): the Hugging Face folder of float32 weights a GGUF
is dequantized into once, keyed by the GGUF's sha256; and the file checks the loader's stores share.

The folder is built under the key's file lock in a temporary folder and renamed into place, so two processes
converting the same GGUF at once both end up reading one complete entry; its record (written last) lists every
file with its size and the GGUF's facts. One that is incomplete (a crash, a truncated or deleted file) or
that an older converter wrote (headlens.cache.VERSION) is rebuilt.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from headlens import cache
from headlens.errors import CacheEntryError, ModelLoadError
from headlens.files import cache_root

KIND = "converted"
SHA256_HEX = cache.SHA256_HEX  # a GGUF's sha256 and every cache key


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, links resolved, is `root` (resolved) or lies under it."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def converted_key(sha256: str) -> str:
    """The cache key of the converted folder of the GGUF whose sha256 is `sha256`."""
    if not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256)):
        raise ModelLoadError(f"{str(sha256)[:80]!r} is not a sha256 (64 lowercase hex digits): refused as a cache key")
    return cache.key(KIND, sha256)


def converted_entry(sha256: str, build) -> tuple[Path, dict]:
    """The cache folder of the model whose GGUF has `sha256`, and its record. The first time (and
    again when the entry is incomplete) `build(folder)` writes the files and returns the source
    facts for the record."""
    entry_key = converted_key(sha256)

    def write(folder: Path) -> dict:
        facts = dict(build(folder), sha256=sha256)
        return {"model": str(facts.get("file", "")), **facts}

    try:
        return cache.build(KIND, entry_key, write)
    except ModelLoadError:
        raise
    except CacheEntryError as exc:
        raise ModelLoadError(str(exc)) from None
    except OSError as exc:
        where = cache_root() / KIND
        raise ModelLoadError(f"cannot write the converted model into {where}: {exc.strerror or exc}") from None
