"""Vectorized torch dequantization of GGUF tensors: ggml's block formats unpacked with whole-tensor
tensor ops instead of numpy's per-type Python loops.

Each block layout follows ggml's reference decoders (`dequantize_row_*` in ggml-quants.c); the
tests check every type against `gguf.quants.dequantize`. Values are computed in float32, as ggml
does. A type without a decoder here raises UnsupportedQuantError naming it.
"""

from __future__ import annotations

import numpy as np
import torch

from headlens.errors import UnsupportedQuantError

# ggml type id -> (name, elements per block, bytes per block), as numbered by `enum ggml_type` in ggml.h
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}


def type_name(ggml_type: int) -> str:
    """ "Q4_K" for 12; the gguf package's name (or the number) for a type we do not decode."""
    if ggml_type in GGML_TYPES:
        return GGML_TYPES[ggml_type][0]
    try:
        import gguf

        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def check_supported_type(ggml_type: int, tensor: str = "") -> None:
    if ggml_type not in GGML_TYPES:
        where = f" (tensor {tensor})" if tensor else ""
        supported = ", ".join(name for name, _, _ in GGML_TYPES.values())
        raise UnsupportedQuantError(
            f"GGUF quantization type {type_name(ggml_type)}{where} is not supported by "
            f"headlens's dequantizer; supported: {supported}"
        )


def row_bytes(ggml_type: int, n_elements: int) -> int:
    """Bytes that `n_elements` of this type occupy (a whole number of blocks)."""
    check_supported_type(ggml_type)
    _, block_elements, block_bytes = GGML_TYPES[ggml_type]
    return n_elements // block_elements * block_bytes


CHUNK_ELEMENTS = 1 << 16  # values decoded per pass: the block's intermediates stay in the L2 cache


def dequantize(data, ggml_type: int) -> np.ndarray:
    """Raw GGUF bytes `[..., row_bytes]` (uint8, numpy or torch) -> float32 `[..., row_elements]`.

    The signature of `gguf.quants.dequantize`, so it can stand in for it (headlens.load.gguf_load).
    Decoded CHUNK_ELEMENTS values at a time into one output buffer.
    """
    ggml_type = int(ggml_type)
    check_supported_type(ggml_type)
    raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True)) if not torch.is_tensor(data) else data
    _, block_elements, block_bytes = GGML_TYPES[ggml_type]
    blocks = raw.reshape(-1, block_bytes)  # [block, byte]
    out = torch.empty(blocks.shape[0], block_elements)  # [block, element]
    step = max(1, CHUNK_ELEMENTS // block_elements)
    decode = _DECODERS[ggml_type]
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = decode(blocks[start : start + step])
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // block_bytes * block_elements).numpy()


# -- the formats ----------------------------------------------------------------------------------


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 scalar at byte `start` of every block, as float32."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()  # [block, 1]


def _lo_hi(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Bytes -> their low and high nibbles along a new axis of size 2 at `dim` (low first), written
    in place into one buffer (torch.cat of uint8 is several times slower)."""
    shape = list(x.shape)
    shape.insert(dim, 2)
    out = torch.empty(shape, dtype=torch.uint8)
    torch.bitwise_and(x, 0xF, out=out.select(dim, 0))
    torch.bitwise_right_shift(x, 4, out=out.select(dim, 1))
    return out


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 four-bit values: the low nibbles first, then the high ones (ggml's order)."""
    return _lo_hi(qs, 1).reshape(qs.shape[0], 32)  # [block, 32]


def _fifth_bits(qh4: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 32-bit plane of fifth bits -> 16 for each of the 32 values (bit j for value j)."""
    bit = torch.arange(8, dtype=torch.uint8)
    return (((qh4.unsqueeze(-1) >> bit) & 1) << 4).reshape(qh4.shape[0], 32)  # [block, 32]


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    scale = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], dim=1)  # [block, 8]
    minimum = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)  # [block, 8]
    return scale.float(), minimum.float()


def _shifted(data: torch.Tensor, shifts: tuple[int, ...], bits: int) -> torch.Tensor:
    """`[block, group, byte]` -> `[block, group, len(shifts), byte]`, each byte read at each shift."""
    shift = torch.tensor(shifts, dtype=torch.uint8).reshape(1, 1, -1, 1)
    return (data.unsqueeze(2) >> shift) & ((1 << bits) - 1)


def _q4_0(b):
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).float() - 8)  # [block, 32]


def _q4_1(b):
    return _f16(b, 0) * _nibbles(b[:, 4:20]).float() + _f16(b, 2)  # [block, 32]


def _q5_0(b):
    q = _nibbles(b[:, 6:22]) | _fifth_bits(b[:, 2:6])  # [block, 32]
    return _f16(b, 0) * (q.float() - 16)


def _q5_1(b):
    q = _nibbles(b[:, 8:24]) | _fifth_bits(b[:, 4:8])  # [block, 32]
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b):
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()  # [block, 32]


def _q2_k(b):
    n = b.shape[0]
    sc = b[:, 0:16]  # one byte per 16 values: scale low nibble, min high nibble
    dl = (_f16(b, 80) * (sc & 0xF).float()).reshape(n, 16, 1)  # [block, group, 1]
    ml = (_f16(b, 82) * (sc >> 4).float()).reshape(n, 16, 1)
    q = _shifted(b[:, 16:80].reshape(n, 2, 32), (0, 2, 4, 6), 2)  # [block, half, shift, 32]
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, 256)


def _q3_k(b):
    n = b.shape[0]
    s = b[:, 96:108]
    low = _lo_hi(s[:, 0:8], 1).reshape(n, 16)  # [block, 16]
    high = _shifted(s[:, 8:12].reshape(n, 1, 4), (0, 2, 4, 6), 2).reshape(n, 16)  # [block, 16]
    scale = ((low | (high << 4)).float() - 32).reshape(n, 16, 1)  # [block, group, 1]
    q = _shifted(b[:, 32:96].reshape(n, 2, 32), (0, 2, 4, 6), 2).reshape(n, 8, 32)  # [block, group-pair, 32]
    bit = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
    h = (b[:, 0:32].reshape(n, 1, 32) >> bit) & 1  # [block, group-pair, 32]: the mask bit clear subtracts 4
    values = q.float() - 4 * (1 - h.float())  # [block, 8, 32]
    return (_f16(b, 108).reshape(n, 1, 1) * scale * values.reshape(n, 16, 16)).reshape(n, 256)


def _q4_k(b):
    n = b.shape[0]
    scale, minimum = _k_scales(b[:, 4:16])  # [block, 8]
    q = _lo_hi(b[:, 16:144].reshape(n, 4, 32), 2).reshape(n, 8, 32)  # [block, group, 32]
    d, dmin = _f16(b, 0), _f16(b, 2)
    return ((d * scale).unsqueeze(-1) * q.float() - (dmin * minimum).unsqueeze(-1)).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    scale, minimum = _k_scales(b[:, 4:16])  # [block, 8]
    low = _lo_hi(b[:, 48:176].reshape(n, 4, 32), 2).reshape(n, 8, 32)  # [block, group, 32]
    bit = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
    high = (b[:, 16:48].reshape(n, 1, 32) >> bit) & 1  # [block, group, 32]: group g reads bit g
    q = (low | (high << 4)).float()
    d, dmin = _f16(b, 0), _f16(b, 2)
    return ((d * scale).unsqueeze(-1) * q - (dmin * minimum).unsqueeze(-1)).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # [block, half, quarter-pair, 32]
    low = _lo_hi(ql, 2).reshape(n, 2, 4, 32)  # [block, half, quarter, 32]
    high = _shifted(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 2)  # [block, half, quarter, 32]
    q = (low | (high << 4)).float() - 32
    scale = b[:, 192:208].contiguous().view(torch.int8).float().reshape(n, 16, 1)  # [block, group, 1]
    return (_f16(b, 208).reshape(n, 1, 1) * scale * q.reshape(n, 16, 16)).reshape(n, 256)


def _float(dtype):
    return lambda b: b.contiguous().view(dtype).float()  # [element, 1]


_DECODERS = {
    0: _float(torch.float32),
    1: _float(torch.float16),
    30: _float(torch.bfloat16),
    2: _q4_0,
    3: _q4_1,
    6: _q5_0,
    7: _q5_1,
    8: _q8_0,
    10: _q2_k,
    11: _q3_k,
    12: _q4_k,
    13: _q5_k,
    14: _q6_k,
}
