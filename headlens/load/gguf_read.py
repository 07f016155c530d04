"""Reading a GGUF file's header: metadata, tensor table and where each tensor's bytes lie.

A struct walk over the memory-mapped file (GGUF v2/v3, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
`gguf.GGUFReader` builds a numpy view per vocabulary entry, which takes tens of seconds for a
262k-token vocabulary; this reads the same header in about a second. A file that is truncated,
not GGUF, or damaged is one ModelLoadError line. Numeric metadata arrays are read as numpy views of the
mapped file, and an array no reader uses (longer than a per-layer list, not the tokenizer's) is not kept, so
the memory a header takes does not grow with a hostile array.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headlens.bounds import MAX_LAYERS, MAX_WIDTH, check_shape, printable
from headlens.errors import ModelLoadError
from headlens.load.dequant import GGML_TYPES, row_bytes, type_name

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TAIL = 1 << 20  # bytes a file may run on past its last tensor (padding)
_INTEGER_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)  # the integer value types (7 is bool)

# metadata value types (gguf.GGUFValueType) -> struct format of the fixed-size ones
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: its GGUF name, numpy-order shape, ggml type and raw bytes."""

    name: str
    shape: tuple[int, ...]  # numpy order (ggml lists the fastest-moving dimension first)
    ggml_type: int
    data: np.ndarray  # uint8 [..., row_bytes], a read-only view of the mapped file


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF header. `types[key]` keeps each metadata value's GGUF type (arrays: (9, item))."""

    path: Path
    metadata: dict
    types: dict
    tensors: tuple[TensorEntry, ...]

    @property
    def architecture(self) -> str:
        """`general.architecture`, control characters escaped (it is shown in messages)."""
        return printable(str(self.metadata.get("general.architecture", "?")))

    @property
    def quantization(self) -> str:
        """The file's quantization as llama.cpp names it ("Q4_1", "Q4_K_M": `general.file_type`), else
        the dominant type (by element count) of its weight matrices other than the embedding."""
        import gguf

        file_type = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except (TypeError, ValueError):
            pass
        counts = Counter()
        for tensor in self.tensors:
            if len(tensor.shape) >= 2 and not tensor.name.startswith("token_embd"):
                counts[type_name(tensor.ggml_type)] += int(np.prod(tensor.shape))
        return counts.most_common(1)[0][0] if counts else "F32"


class _Cursor:
    """Little-endian reads from a buffer; running past its end means the file is truncated."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.pos, self.path = buffer, 0, path

    def read(self, fmt: str):
        try:
            values = struct.unpack_from(fmt, self.buffer, self.pos)
        except struct.error:
            raise ModelLoadError(f"{self.path} is truncated or not a GGUF file (header ends early)") from None
        self.pos += struct.calcsize(fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.read("<Q")
        if self.pos + length > len(self.buffer):
            raise ModelLoadError(f"{self.path} is truncated or damaged (a header string runs past the end)")
        raw = bytes(self.buffer[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.read("<Q")
        if self.pos + length > len(self.buffer):
            raise ModelLoadError(f"{self.path} is truncated or damaged (a header string runs past the end)")
        self.pos += length

    def value(self, value_type: int, key: str):
        """The value of metadata `key` and its type; an array no reader uses (kept_array) is walked over and
        its value is SKIPPED, so a hostile array never becomes millions of Python objects."""
        if value_type in _SCALAR:
            return self.read(_SCALAR[value_type]), value_type
        if value_type == _STRING:
            return self.string(), value_type
        if value_type == _ARRAY:
            item_type, count = self.read("<IQ")
            if count > len(self.buffer) - self.pos:  # every item takes at least a byte
                raise ModelLoadError(
                    f"{self.path} is truncated or damaged (an array of {count:,} items runs past the end)"
                )
            keep = kept_array(self.path, key, count)
            if item_type in _SCALAR:
                items = self._numbers(_SCALAR[item_type], count)  # [count], a view of the mapped file
                return (items.tolist() if keep else SKIPPED), (value_type, item_type)
            if item_type == _STRING:
                if not keep:
                    for _ in range(count):
                        self.skip_string()
                    return SKIPPED, (value_type, item_type)
                return [self.string() for _ in range(count)], (value_type, item_type)
        raise ModelLoadError(f"{self.path} holds a metadata value of unknown GGUF type {value_type}: damaged file")

    def _numbers(self, fmt: str, count: int) -> np.ndarray:
        """`count` numbers of struct format `fmt` from here, as a numpy view (no Python object per item)."""
        dtype = np.dtype(fmt.replace("?", "b1"))  # [count]
        end = self.pos + count * dtype.itemsize
        if end > len(self.buffer):
            raise ModelLoadError(f"{self.path} is truncated or not a GGUF file (header ends early)")
        items = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.pos)  # [count]
        self.pos = end
        return items


SKIPPED = object()  # an unused metadata array's value: never stored
MAX_TOKENIZER_ITEMS = 4 * MAX_WIDTH  # entries a tokenizer array (tokens, scores, merges) may have
_TOKENIZER_PREFIX = "tokenizer.ggml."


def kept_array(path: Path, key: str, count: int) -> bool:
    """Whether a metadata array is kept: a tokenizer's (`tokenizer.ggml.*`, up to MAX_TOKENIZER_ITEMS entries,
    else ModelLoadError) or one of at most MAX_LAYERS items (a per-layer list); any longer one is of no use to
    headlens or transformers and is skipped."""
    if key.startswith(_TOKENIZER_PREFIX):
        if count > MAX_TOKENIZER_ITEMS:
            raise ModelLoadError(
                f"{path}: metadata {printable(key)[:60]} has {count:,} entries, more than the "
                f"{MAX_TOKENIZER_ITEMS:,} a vocabulary may have: the file is damaged or hostile"
            )
        return True
    return count <= MAX_LAYERS


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse `path`'s header and check that every tensor's bytes lie inside the file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            if size < 24:
                raise ModelLoadError(f"{path} is truncated or not a GGUF file ({size} bytes)")
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    if buffer[:4] != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (no GGUF magic bytes)")
    cursor = _Cursor(buffer, path)
    cursor.pos = 4
    version, n_tensors, n_kv = cursor.read("<IQQ")
    if version not in (2, 3):
        raise ModelLoadError(f"{path} is GGUF version {version}; headlens reads versions 2 and 3")
    metadata, types = {}, {}
    for _ in range(n_kv):
        key = cursor.string()
        value, value_type = cursor.value(cursor.read("<I"), key)
        if value is not SKIPPED:
            metadata[key], types[key] = value, value_type
    table = []
    for _ in range(n_tensors):
        name = cursor.string()
        n_dims = cursor.read("<I")
        if n_dims > MAX_DIMS:
            raise ModelLoadError(
                f"{path}: tensor {printable(name)[:80]} has {n_dims:,} dimensions (GGUF allows {MAX_DIMS})"
            )
        dims = cursor.read(f"<{n_dims}Q") if n_dims else ()
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        ggml_type, offset = cursor.read("<IQ")
        table.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = _alignment(path, metadata, types)
    start = (cursor.pos + alignment - 1) // alignment * alignment
    blob = np.frombuffer(buffer, dtype=np.uint8)
    tensors = tuple(_entry(blob, path, start, *row) for row in table)
    _check_tail(path, blob, start, tensors)
    return GGUFFile(path=path, metadata=metadata, types=types, tensors=tensors)


def _check_tail(path: Path, blob: np.ndarray, start: int, tensors: tuple[TensorEntry, ...]) -> None:
    """ModelLoadError when the file runs on more than MAX_TAIL bytes past the end of its last tensor: a GGUF
    ends with its tensor data, and a file that does not (a sparse terabyte behind a small header) is not
    hashed or read any further."""
    ends = [start] + [_end(blob, tensor) for tensor in tensors]
    tail = blob.shape[0] - max(ends)
    if tail > MAX_TAIL:
        raise ModelLoadError(
            f"{path} runs on {tail:,} bytes past the end of its tensor data: not a GGUF file as llama.cpp writes it"
        )


def _end(blob: np.ndarray, tensor: TensorEntry) -> int:
    if tensor.data.size == 0:
        return 0
    begin = tensor.data.__array_interface__["data"][0] - blob.__array_interface__["data"][0]
    return begin + tensor.data.size


def _entry(
    blob: np.ndarray, path: Path, start: int, name: str, shape: tuple, ggml_type: int, offset: int
) -> TensorEntry:
    if ggml_type not in GGML_TYPES:  # the size of an unknown block is unknown: keep the row empty
        return TensorEntry(name, shape, ggml_type, blob[:0])
    n_rows = math.prod(shape[:-1])  # Python integers: a product of hostile dimensions cannot wrap around
    width = row_bytes(ggml_type, shape[-1] if shape else 1)
    begin, end = start + offset, start + offset + n_rows * width
    if end > blob.shape[0]:
        name = printable(name)[:80]
        raise ModelLoadError(
            f"{path} is truncated: tensor {name} needs bytes up to {end:,}, the file has {blob.shape[0]:,}"
        )
    return TensorEntry(name, shape, ggml_type, blob[begin:end].reshape(*shape[:-1], width))


def _alignment(path: Path, metadata: dict, types: dict) -> int:
    """`general.alignment` (default 32): an integer power of two, as llama.cpp requires."""
    alignment = metadata.get("general.alignment", 32)
    if "general.alignment" in types and types["general.alignment"] not in _INTEGER_TYPES:
        alignment = None
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise ModelLoadError(
            f"{path}: general.alignment is {printable(repr(alignment))[:40]}, not a power of two: damaged file"
        )
    return alignment


def check_model_header(parsed: GGUFFile) -> None:
    """ModelLoadError unless the header names its architecture and declares a shape within
    headlens.bounds (layers, heads, key/value heads, width, head width), before anything is converted."""
    arch = parsed.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelLoadError(f"{parsed.path} declares no general.architecture: not a model GGUF headlens can read")

    def fact(key: str):
        value = parsed.metadata.get(f"{arch}.{key}")
        if isinstance(value, list) and value and all(type(item) is int for item in value):
            return max(value)  # a per-layer list (some architectures): its largest entry is bounded
        return value

    check_shape(
        f"{parsed.path} ({parsed.architecture})",
        n_layers=fact("block_count"),
        n_heads=fact("attention.head_count"),
        d_model=fact("embedding_length"),
        n_kv_heads=fact("attention.head_count_kv"),
        d_head=fact("attention.key_length"),
    )
