"""Loading: local directories, the hub cache, the shipped tokenizer, and every way loading fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from headlens.errors import ModelLoadError
from headlens.load.hub import hub_cache_dir
from headlens.load.models import build_model, gpt2_tokenizer, load_model, save_model

# GPT-2's own ids for this sentence (Hugging Face `gpt2` tokenizer, also tiktoken "gpt2").
HELLO_TEXT = "Hello world, the cat sat."
HELLO_IDS = [15496, 995, 11, 262, 3797, 3332, 13]
# Without HF_HUB_OFFLINE the hub attempt must give up quickly on a machine with no network
# (the limit covers importing torch and transformers and the hub's etag_timeout of 10 s, with room for a slow machine).
HUB_FAIL_FAST_SECONDS = 60


@pytest.fixture()
def model_copy(small_model_dir, tmp_path):
    """A private copy of the saved small model, free to damage."""
    return shutil.copytree(small_model_dir, tmp_path / "model")


def test_local_dir_round_trip(small_model, small_model_dir):
    loaded = load_model(str(small_model_dir))
    assert loaded.spec == small_model.spec
    assert loaded.path == small_model_dir
    assert loaded.model.config._attn_implementation == "eager"
    ids = torch.tensor([HELLO_IDS])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, small_model.model(ids).logits, atol=0, rtol=0)
    assert loaded.tokenizer(HELLO_TEXT)["input_ids"] == HELLO_IDS


def test_shape_facts_come_from_the_config(small_model):
    spec = small_model.spec
    assert (spec.n_layers, spec.n_heads, spec.d_model, spec.d_head, spec.n_ctx) == (2, 4, 64, 16, 128)
    assert spec.n_params == sum(p.numel() for p in small_model.model.parameters())


def test_gpt2_tokenizer_ids_offline():
    tokenizer = gpt2_tokenizer()
    assert tokenizer(HELLO_TEXT)["input_ids"] == HELLO_IDS
    assert len(tokenizer) == 50257
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 50256


def test_hub_id_resolves_through_hf_home(small_model_dir, tmp_path, monkeypatch):
    """A hub id is looked up in the cache under HF_HOME (read when loading, not at import)."""
    snapshot = tmp_path / "hf" / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    shutil.copytree(small_model_dir, snapshot)
    (tmp_path / "hf" / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hf" / "hub" / "models--gpt2" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    loaded = load_model("gpt2")
    assert loaded.path == snapshot
    assert loaded.spec.n_layers == 2


# Errors -----------------------------------------------------------------------------------


def test_hub_id_without_cache_offline_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as info:
        load_model("gpt2")
    message = str(info.value)
    assert "'gpt2'" in message and str(tmp_path / "empty") in message
    assert "local directory" in message and "\n" not in message


@pytest.mark.slow
def test_hub_id_without_network_fails_fast(tmp_path):
    """No HF_HUB_OFFLINE: the download attempt must fail cleanly, not hang (no network here)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty")}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "headlens.cli.main", "heads", "0.0", "--model", "gpt2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HUB_FAIL_FAST_SECONDS * 2,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert elapsed < HUB_FAIL_FAST_SECONDS
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'gpt2'" in lines[0] and "Traceback" not in proc.stderr


def test_missing_dir(tmp_path):
    with pytest.raises(ModelLoadError, match="no such model directory"):
        load_model(str(tmp_path / "nowhere"))


def test_file_instead_of_dir(tmp_path):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(str(path))


def test_missing_config_and_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="has no weights"):
        load_model(str(model_copy))
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(model_copy))


def test_unsupported_family(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["model_type"] = "bert"
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="'bert' is not supported"):
        load_model(str(model_copy))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(model_copy, damage):
    weights = model_copy / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    assert "corrupt" in str(info.value) and "\n" not in str(info.value)


def test_bin_checkpoint_loads_with_weights_only(small_model, model_copy):
    """transformers 5 reads pytorch_model.bin with torch.load(weights_only=True): plain tensors load."""
    (model_copy / "model.safetensors").unlink()
    torch.save(small_model.model.state_dict(), model_copy / "pytorch_model.bin")
    loaded = load_model(str(model_copy))
    ids = torch.tensor([HELLO_IDS])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, small_model.model(ids).logits, atol=0, rtol=0)


class _Payload:
    """An arbitrary object: unpickling it needs code execution, which weights_only forbids."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_bin_checkpoint_with_code_is_refused(model_copy):
    (model_copy / "model.safetensors").unlink()
    torch.save({"transformer.wte.weight": _Payload()}, model_copy / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="weights_only=True"):
        load_model(str(model_copy))


def test_shipped_model_missing_is_clear(monkeypatch, tmp_path):
    import headlens.load.models as models

    monkeypatch.setattr(models, "shipped_path", lambda name: tmp_path / name)
    with pytest.raises(ModelLoadError, match="shipped model 'tiny' is missing"):
        load_model("tiny")


def test_save_model_round_trip_of_built_model(small_config, tmp_path):
    loaded = build_model(small_config, seed=3)
    directory = save_model(loaded, tmp_path / "saved")
    assert (directory / "model.safetensors").is_file() and (directory / "config.json").is_file()
    assert load_model(str(directory)).spec == loaded.spec
