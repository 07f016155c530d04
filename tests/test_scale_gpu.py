"""On a CUDA GPU (skipped without one; benchmarks/gpu_check.sh runs these): half-precision capture
and classification against float32 on the GPU, cached needle decoding, and a model split by
`device_map` across the GPU and the CPU against the same model whole on the GPU."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headlens.classify import SCORE_COLUMNS, ClassifyConfig, classify_heads
from headlens.load.models import load_model, save_model
from tests.helpers.decoding import assert_same_steps, cache_prompts, dtype_tolerance
from tests.helpers.strong import build_strong_model, sample_text

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# As on the CPU: half-precision scores within a few eps of float32 (tests/test_scale_precision.py).
# Layers split between GPU and CPU run different kernels (cuBLAS vs CPU BLAS): float32 rounding
# accumulates over the layers; a misplaced or skipped layer moves scores by >= 1e-2.
CROSS_DEVICE_ATOL = 1e-4
CONFIG = ClassifyConfig(n_seq=4)


@pytest.fixture(scope="module")
def strong_dir(tmp_path_factory):
    return save_model(build_strong_model(64), tmp_path_factory.mktemp("strong"))


def _assert_scores_close(got, want, atol):
    """`atol`: a number, or column -> number."""
    for column in SCORE_COLUMNS:
        if column == "positional_offset":
            continue
        torch.testing.assert_close(
            torch.tensor(got[column].values, dtype=torch.float64),
            torch.tensor(want[column].values, dtype=torch.float64),
            atol=atol(column) if callable(atol) else atol,
            rtol=0,
            equal_nan=True,
            msg=column,
        )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_capture_parity_on_the_gpu(strong_dir, dtype):
    text = sample_text(1500)
    want = classify_heads(load_model(strong_dir, device="cuda", dtype="float32"), text, CONFIG).frame
    half = load_model(strong_dir, device="cuda", dtype=dtype)
    assert next(half.model.parameters()).is_cuda
    got = classify_heads(half, text, CONFIG).frame
    _assert_scores_close(got, want, lambda column: dtype_tolerance(column, getattr(torch, dtype)))


def test_cached_needles_equal_uncached_on_the_gpu(strong_dir):

    loaded = load_model(strong_dir, device="cuda")
    assert_same_steps(loaded.model, cache_prompts(loaded, sample_text(1500)))


def test_device_map_across_gpu_and_cpu(strong_dir, tmp_path):
    from headlens.ablation import sweep_heads

    whole = load_model(strong_dir, device="cuda")
    # ~13 MB of embeddings fit on the GPU's budget, the blocks spill to the CPU
    split = load_model(strong_dir, device_map="auto", max_memory={0: "13.2MB", "cpu": "1GiB"}, offload_folder=tmp_path)
    placed = set(split.model.hf_device_map.values())
    assert 0 in placed and "cpu" in placed, placed
    text = sample_text(800)
    _assert_scores_close(
        classify_heads(split, text, CONFIG).frame, classify_heads(whole, text, CONFIG).frame, CROSS_DEVICE_ATOL
    )
    want, got = sweep_heads(whole, text=text).frame, sweep_heads(split, text=text).frame
    pd.testing.assert_frame_equal(got, want, check_exact=False, atol=CROSS_DEVICE_ATOL, rtol=0)
