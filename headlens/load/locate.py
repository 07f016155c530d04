"""Where a model name points when it is a GGUF: a named model (headlens.load.pulls), `ollama:NAME[:TAG]`,
a `.gguf` file, or a folder holding one `.gguf` and no config.json. The GGUF is dequantized once
into the cache (headlens.load.cache) and the float folder is what the loader reads; the GGUF reader and
converter (headlens.load.gguf_read, headlens.load.gguf_load, with the dequantizers) are imported only then, so a
model already converted, a plain folder or a shipped model loads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headlens.errors import ModelLoadError
from headlens.load.cache import converted_entry, file_sha256
from headlens.load.ollama import PREFIX, ollama_blob
from headlens.load.pulls import NAMED_MODELS, named_gguf


@dataclass(frozen=True)
class ModelSource:
    """The quantized file a model's float weights were dequantized from."""

    format: str  # "gguf"
    quantization: str  # the dominant type of the weight matrices, e.g. "Q4_1"
    sha256: str  # of the GGUF file (the cache key)
    file: str  # the GGUF's file name


def find_gguf(name_or_path: str) -> tuple[Path, str | None, str] | None:
    """(GGUF path, its sha256 when known without hashing, display name), or None for a non-GGUF model."""
    name_or_path = str(name_or_path)  # a pathlib.Path is accepted as load_model accepts it
    if name_or_path in NAMED_MODELS:
        return named_gguf(name_or_path), NAMED_MODELS[name_or_path].sha256, name_or_path
    if name_or_path.startswith(PREFIX):
        return ollama_blob(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_file() and (path.suffix == ".gguf" or _has_magic(path)):
        return path, None, path.name.removesuffix(".gguf")
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ModelLoadError(
                f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}): pass the one to load"
            )
        if found:
            return found[0], None, found[0].name.removesuffix(".gguf")
    return None


def gguf_folder(gguf_path: Path, sha256: str | None) -> tuple[Path, ModelSource]:
    """The cached float folder for a GGUF (converted on first use), and its source record. A file whose
    sha256 is not known is hashed only after its header was read and checked (gguf_read): a damaged or
    hostile file (a sparse terabyte behind a small header) is refused before it is read whole."""
    known = sha256
    checked = None
    if sha256 is None:
        from headlens.load import gguf_read

        checked = gguf_read.read_gguf(gguf_path)
        gguf_read.check_model_header(checked)
        sha256 = file_sha256(gguf_path)

    def build(folder: Path) -> dict:
        from headlens.load import gguf_load, gguf_read  # the first load of this GGUF only: converting is optional

        parsed = checked or gguf_read.read_gguf(gguf_path)
        gguf_read.check_model_header(parsed)  # its shape, before anything is allocated or hashed
        if known is not None and file_sha256(gguf_path) != known:
            raise ModelLoadError(
                f"{gguf_path} does not have the sha256 its source names ({known}): the file is "
                f"damaged; fetch it again (headlens pull / ollama pull)"
            )
        gguf_load.convert_gguf(parsed, folder)
        return {
            "format": "gguf",
            "quantization": parsed.quantization,
            "file": gguf_path.name,
            "architecture": parsed.architecture,
            "model_name": str(parsed.metadata.get("general.name", "")),
        }

    entry, record = converted_entry(sha256, build)
    source = ModelSource(
        format=record.get("format", "gguf"),
        quantization=record.get("quantization", "?"),
        sha256=sha256,
        file=record.get("file", gguf_path.name),
    )
    return entry, source


def _has_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False
