"""Models larger than one device: layers placed by accelerate (`device_map`), some offloaded to
disk, give the same classification, ablation and exact sweep as the model in one piece."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from headlens.ablation import ablate_heads, sweep_heads
from headlens.classify import SCORE_COLUMNS, ClassifyConfig, classify_heads
from headlens.load.devices import is_offloaded
from headlens.load.models import load_model, save_model
from tests.helpers.strong import build_strong_model, sample_text

# Same weights, same operations: an offloaded layer runs the same kernels once accelerate has
# loaded it, so the results agree to float32 rounding at most (the bound, 1e-6).
SPLIT_ATOL = 1e-6
# Layer 0 in memory, layer 1 on disk: consecutive layers on different "devices".
SPLIT = {
    "transformer.wte": "cpu",
    "transformer.wpe": "cpu",
    "transformer.drop": "cpu",
    "transformer.h.0": "cpu",
    "transformer.h.1": "disk",
    "transformer.ln_f": "cpu",
    "lm_head": "cpu",
}
CONFIG = ClassifyConfig(n_seq=4)


@pytest.fixture(scope="module")
def strong_dir(tmp_path_factory):
    return save_model(build_strong_model(64), tmp_path_factory.mktemp("strong"))


@pytest.fixture(scope="module")
def whole_and_split(strong_dir, tmp_path_factory):
    whole = load_model(strong_dir)
    split = load_model(strong_dir, device_map=SPLIT, offload_folder=tmp_path_factory.mktemp("offload"))
    return whole, split


def test_the_split_is_real(whole_and_split):
    _, split = whole_and_split
    attn = split.model.transformer.h[1].attn.c_proj
    assert is_offloaded(attn) and attn.weight.device.type == "meta"
    assert not is_offloaded(split.model.transformer.h[0].attn.c_proj)


def test_classification_equals_the_unsplit_model(whole_and_split, one_thread):
    whole, split = whole_and_split
    text = sample_text(800)
    want, got = classify_heads(whole, text, CONFIG).frame, classify_heads(split, text, CONFIG).frame
    for column in SCORE_COLUMNS:
        torch.testing.assert_close(
            torch.tensor(got[column].values, dtype=torch.float64),
            torch.tensor(want[column].values, dtype=torch.float64),
            atol=SPLIT_ATOL,
            rtol=0,
            equal_nan=True,
            msg=column,
        )
    assert got["labels"].tolist() == want["labels"].tolist()


def test_ablation_and_the_exact_sweep_equal_the_unsplit_model(whole_and_split, one_thread):
    whole, split = whole_and_split
    text = sample_text(600)
    want, got = sweep_heads(whole, text=text).frame, sweep_heads(split, text=text).frame
    assert (want["delta_loss"].abs() > 1e-3).any()  # the heads matter: a real comparison
    pd.testing.assert_frame_equal(got, want, check_exact=False, atol=SPLIT_ATOL, rtol=0)
    together = "0.1,1.2"
    a, b = ablate_heads(whole, together, text=text).meta, ablate_heads(split, together, text=text).meta
    assert b["delta_loss"] == pytest.approx(a["delta_loss"], abs=SPLIT_ATOL)


def test_cli_device_map_auto_with_disk_offload(strong_dir, tmp_path):
    from headlens.cli.main import cli

    args = ["classify", str(strong_dir), "--n-seq", "2", "--no-needles", "--format", "json", "--no-progress"]
    runner = CliRunner()
    whole = runner.invoke(cli, args)
    # the embeddings (~12.9 MB) fit in 13.2 MB of CPU memory, the blocks go to disk
    split = runner.invoke(
        cli,
        [*args, "--device-map", "auto", "--max-memory", "cpu=13.2MB", "--offload-folder", str(tmp_path / "offload")],
    )
    assert whole.exit_code == 0 and split.exit_code == 0, split.output
    placed = load_model(strong_dir, device_map="auto", max_memory={"cpu": "13.2MB"}, offload_folder=tmp_path / "o")
    assert "disk" in placed.model.hf_device_map.values()  # the same options really offload to disk
    for a, b in zip(json.loads(whole.stdout), json.loads(split.stdout), strict=True):
        for column in SCORE_COLUMNS:
            if a[column] is not None:
                assert b[column] == pytest.approx(a[column], abs=SPLIT_ATOL), column
