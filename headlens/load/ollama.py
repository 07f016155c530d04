"""`ollama:[HOST/][NAMESPACE/]MODEL[:TAG]`: a model from the local Ollama store (`OLLAMA_MODELS`, else
~/.ollama/models).

The manifest `manifests/HOST/NAMESPACE/MODEL/TAG` (HOST defaults to `registry.ollama.ai`, NAMESPACE to
`library`, TAG to `latest`) is JSON whose layer of media type `application/vnd.ollama.image.model`
names the GGUF blob by digest `sha256:HEX`, stored as `blobs/sha256-HEX`. Nothing is downloaded.

Nothing in the name or the store is trusted: every part of the name must match Ollama's own grammar
(ollama/ollama types/model/name.go, `isValidPart`: 1-80 characters, host up to 350, the first a
letter, digit or `_`, then letters, digits, `_`, `-`, `.` (not in a namespace) and, in a host, `:`
before a port number), checked before any file is read; the digest must be `sha256:` and 64 lowercase hex digits;
the manifest and the blob must resolve to regular files inside the store, and the manifest is read
up to MAX_MANIFEST bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from headlens.bounds import shown
from headlens.errors import ModelLoadError
from headlens.files import parse_json
from headlens.load.cache import SHA256_HEX, inside

PREFIX = "ollama:"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MAX_MANIFEST = 1 << 20  # bytes: a real manifest is about 1 KB
_PART = {  # Ollama's grammar of each name part (isValidLen and isValidPart)
    "host": re.compile(r"(?=.{1,350}$)[A-Za-z0-9_][A-Za-z0-9_.-]*(:[0-9]{1,5})?", re.S),  # `:` only before a port
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}


def ollama_store() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def parse_name(spec: str) -> tuple[str, str, str, str]:
    """`ollama:[HOST/][NAMESPACE/]MODEL[:TAG]` -> (host, namespace, model, tag), defaults filled in;
    ModelLoadError unless every part matches Ollama's grammar. Reads no file."""
    text = spec[len(PREFIX) :]
    rest, colon, tag = text.rpartition(":")
    if not colon or "/" in tag:  # no tag (a colon before a slash belongs to a host's port)
        rest, tag = text, DEFAULT_TAG
    pieces = rest.split("/")
    too_many = len(pieces) > 3  # more parts than host/namespace/model
    host, namespace, model = ("",) * 3 if too_many else [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(pieces)] + pieces
    parts = {"host": host, "namespace": namespace, "model": model, "tag": tag}
    bad = [kind for kind, value in parts.items() if not _PART[kind].fullmatch(value)]
    if bad:
        what = "more than three /-separated parts" if too_many else f"its {' and '.join(bad)} breaks Ollama's rules"
        raise ModelLoadError(
            f"{spec!r} is not an Ollama model name ({what}): write "
            "ollama:MODEL, ollama:MODEL:TAG or ollama:NAMESPACE/MODEL:TAG (letters, digits, _ - .)"
        )
    return host, namespace, model, tag


def ollama_blob(spec: str) -> tuple[Path, str, str]:
    """`ollama:NAME[:TAG]` -> (GGUF blob path, its sha256, "NAME:TAG")."""
    host, namespace, model, tag = parse_name(spec)
    label = f"{model if namespace == DEFAULT_NAMESPACE else f'{namespace}/{model}'}:{tag}"
    store = ollama_store()
    manifest = store / "manifests" / host / namespace / model / tag
    if not manifest.is_file():
        raise ModelLoadError(
            f"ollama model {label} is not in the Ollama store ({manifest} is missing): "
            f"run `ollama pull {label}` or set OLLAMA_MODELS"
        )
    digest = _model_digest(_inside_store(manifest, store, label))
    hexdigest = digest.removeprefix("sha256:")
    blob = store / "blobs" / f"sha256-{hexdigest}"
    if not blob.is_file():
        raise ModelLoadError(f"ollama model {label}: its blob {blob} is missing from the store")
    return _inside_store(blob, store, label), hexdigest, label


def _inside_store(path: Path, store: Path, shown: str) -> Path:
    """`path` resolved (links followed), or ModelLoadError when it lies outside the store."""
    resolved = path.resolve()
    if not inside(resolved, store):
        raise ModelLoadError(f"ollama model {shown}: {path} leads outside the Ollama store ({store}): refused")
    return resolved


def _model_digest(manifest: Path) -> str:
    """The digest of the manifest's model layer, checked to be `sha256:` and 64 lowercase hex digits."""
    try:
        with open(manifest, "rb") as handle:
            raw = handle.read(MAX_MANIFEST + 1)
        if len(raw) > MAX_MANIFEST:
            raise ValueError("too large")
        layers = parse_json(raw, "manifest", ModelLoadError)["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_MEDIA_TYPE)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):  # ModelLoadError is an OSError
        raise ModelLoadError(f"the Ollama manifest {manifest} names no model layer ({MODEL_MEDIA_TYPE})") from None
    if not (isinstance(digest, str) and digest.startswith("sha256:") and SHA256_HEX.fullmatch(digest[7:])):
        raise ModelLoadError(
            f"the Ollama manifest {shown(str(manifest))} gives its model layer the digest {shown(digest, 40)}, "
            "not sha256: and 64 hex digits: the store is damaged or hostile; refused"
        )
    return digest
