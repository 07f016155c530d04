"""The torch dequantizer (headlens.load.dequant) against the gguf package's numpy reference, type by type."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from headlens.errors import UnsupportedQuantError
from headlens.load.dequant import GGML_TYPES, dequantize, row_bytes

# Byte offsets of each block's fp16 scale/min fields (ggml's block_* structs): random bytes there
# would give inf/nan scales, so they are overwritten with sane fp16 values.
HALF_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
N_BLOCKS = 64
ROWS = 3


def random_tensor(name: str, seed: int) -> np.ndarray:
    """`[ROWS, row_bytes]` uint8: random quants, fp16 scales drawn from N(0, 0.05)."""
    rng = np.random.default_rng(seed)
    ggml_type = next(k for k, v in GGML_TYPES.items() if v[0] == name)
    _, block_elements, block_bytes = GGML_TYPES[ggml_type]
    if name in ("F32", "F16", "BF16"):
        values = rng.normal(0, 1, size=(ROWS, N_BLOCKS)).astype(np.float32)
        if name == "F16":
            return values.astype(np.float16).view(np.uint8)
        if name == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    blocks = rng.integers(0, 256, size=(ROWS * N_BLOCKS, block_bytes), dtype=np.uint8)
    for start in HALF_FIELDS[name]:
        scales = rng.normal(0, 0.05, size=ROWS * N_BLOCKS).astype(np.float16)
        blocks[:, start : start + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(ROWS, N_BLOCKS * block_bytes)


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES), ids=lambda t: GGML_TYPES[t][0])
def test_matches_gguf_reference(ggml_type):
    name = GGML_TYPES[ggml_type][0]
    data = random_tensor(name, seed=ggml_type)
    ours = dequantize(data, ggml_type)
    reference = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(ggml_type)).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == reference.shape
    assert np.isfinite(reference).all()
    # Both compute in float32; they may associate d*q - m differently, so allow a few ulps of the
    # row's largest magnitude.
    tolerance = 4 * np.finfo(np.float32).eps * np.abs(reference).max()
    np.testing.assert_allclose(ours, reference, rtol=0, atol=tolerance)


def test_row_bytes_counts_whole_blocks():
    assert row_bytes(12, 512) == 2 * 144  # Q4_K: 256 values in 144 bytes
    assert row_bytes(0, 10) == 40


# Errors


def test_unsupported_type_is_named():
    iq2_xxs = int(gguf.GGMLQuantizationType.IQ2_XXS)
    with pytest.raises(UnsupportedQuantError, match="IQ2_XXS"):
        dequantize(np.zeros((1, 66), dtype=np.uint8), iq2_xxs)
