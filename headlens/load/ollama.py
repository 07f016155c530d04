"""`ollama:NAME[:TAG]`: a model from the local Ollama store (`OLLAMA_MODELS`, else ~/.ollama/models).

The manifest `manifests/registry.ollama.ai/library/NAME/TAG` (NAME may be `owner/name`; TAG
defaults to `latest`) is JSON whose layer of media type `application/vnd.ollama.image.model` names
the GGUF blob by digest `sha256:HEX`, stored as `blobs/sha256-HEX`. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from headlens.errors import ModelLoadError

PREFIX = "ollama:"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"


def ollama_store() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def ollama_blob(spec: str) -> tuple[Path, str, str]:
    """`ollama:NAME[:TAG]` -> (GGUF blob path, its sha256, "NAME:TAG")."""
    name, _, tag = spec[len(PREFIX) :].partition(":")
    tag = tag or "latest"
    if not name:
        raise ModelLoadError(f"{spec!r} names no model: write ollama:NAME or ollama:NAME:TAG")
    store = ollama_store()
    repo = name if "/" in name else f"library/{name}"
    manifest = store / "manifests" / "registry.ollama.ai" / repo / tag
    if not manifest.is_file():
        raise ModelLoadError(
            f"ollama model {name}:{tag} is not in the Ollama store ({manifest} is missing): "
            f"run `ollama pull {name}:{tag}` or set OLLAMA_MODELS"
        )
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_MEDIA_TYPE)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise ModelLoadError(f"the Ollama manifest {manifest} names no model layer ({MODEL_MEDIA_TYPE})") from None
    algorithm, _, hexdigest = str(digest).partition(":")
    blob = store / "blobs" / f"{algorithm}-{hexdigest}"
    if algorithm != "sha256" or not blob.is_file():
        raise ModelLoadError(f"ollama model {name}:{tag}: its blob {blob} is missing from the store")
    return blob, hexdigest, f"{name}:{tag}"
