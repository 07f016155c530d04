"""Hostile configs, seeds and sweep directories: one line and exit 2 (or, for the resume file, a clean
library error), before any model is built from them; what a sweep says it saved is what is on disk."""

from __future__ import annotations

import json

import pytest

from headlens.ablation.ablate import sweep_heads
from headlens.ablation.store import SweepInterrupted, SweepStore
from headlens.errors import ConfigError
from headlens.heads import all_heads
from tests.helpers.hostile import make_sentinel, refused

GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 50257}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


def model_folder(tmp_path, config) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    return str(folder)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ([GPT2], "not an object"),
        ("7", "not an object"),
        ("[" * 100_000 + "]" * 100_000, "config.json"),
        ({**GPT2, "n_layer": -1}, "layers: expected"),
        ({**GPT2, "n_layer": 100_000}, "layers: expected"),
        ({**GPT2, "n_layer": "12"}, "layers: expected"),
        ({**GPT2, "n_layer": 2.0}, "layers: expected"),
        ({**GPT2, "n_head": 0}, "attention heads: expected"),
        ({**GPT2, "n_head": 5}, "do not divide the width"),
        ({**GPT2, "n_embd": 2**40}, "width: expected"),
        ({**LLAMA, "num_key_value_heads": 3}, "do not divide"),
        ({**LLAMA, "num_hidden_layers": 10**30}, "layers: expected"),
    ],
    ids=[
        "list",
        "number",
        "deep",
        "negative-layers",
        "100k-layers",
        "layers-a-string",
        "layers-a-float",
        "zero-heads",
        "heads-not-dividing",
        "huge-width",
        "kv-not-dividing",
        "absurd-layers",
    ],
)
def test_config_json(tmp_path, sentinel, config, said):
    assert said in refused("heads", "0.0", model_folder(tmp_path, config), sentinel=sentinel)


@pytest.mark.parametrize("seed", [str(2**64), str(-(2**70)), "1e999"])
def test_seed_beyond_64_bits(sentinel, seed):
    assert "--seed" in refused("classify", "tiny", "--seed", seed, sentinel=sentinel)


# Resume files

MANIFEST = {"model": "m", "n_layers": 2, "n_heads": 4}


def sweep_dir(tmp_path, lines: list[str]):
    out = tmp_path / "sweep"
    store = SweepStore(out, MANIFEST, resume=False)
    store.rows_path.write_text("".join(line + "\n" for line in lines))
    return out


GOOD_ROW = {"layer": 0, "head": 0, "n": 4, "clean": 1.5, "ablated": 1.0, "delta": -0.5}


def _row(**change) -> str:
    return json.dumps({**GOOD_ROW, **change})


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        "[1, 2]",
        '{"layer": 0}',
        '{"layer": "0", "head": 1}',
        '{"layer": -1, "head": 0}',
        "\udcff",
        _row(delta='=HYPERLINK("http://evil.example","x")'),
        _row(delta=float("inf")),
        _row(clean=None),
        _row(n=True),
        _row(note="@SUM(A1)"),
        _row(layer=10**30),
        '{"layer": 0, "head": 0, "n": 4, "clean": 1.5, "ablated": 1.0, "delta": 1' + "0" * 5000 + "}",
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=[
        "not-json",
        "a-list",
        "no-head",
        "layer-a-string",
        "negative-layer",
        "not-utf8",
        "delta-a-formula",
        "delta-infinite",
        "clean-null",
        "n-a-bool",
        "extra-field",
        "huge-layer",
        "5000-digits",
        "deep",
    ],
)
def test_damaged_rows_file_on_resume(tmp_path, bad):
    out = sweep_dir(tmp_path, [json.dumps(GOOD_ROW)])
    with open(out / "rows.jsonl", "ab") as handle:
        handle.write(bad.encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(ConfigError, match="line 2 of .*rows.jsonl is not a row"):
        SweepStore(out, MANIFEST, resume=True)


def test_interrupted_sweep_counts_the_rows_on_disk(small_model, tmp_path, monkeypatch):
    """An interrupt after a row reached the disk but before the sweep noted it: the count is the disk's."""
    heads = all_heads(2, 4)
    append = SweepStore.append

    def interrupted_after_writing_three(self, row):
        if len(self.done) == 2:
            with open(self.rows_path, "a") as handle:  # the durable write happened ...
                handle.write(json.dumps(row) + "\n")
            raise KeyboardInterrupt  # ... and the interrupt came before the store's own count
        append(self, row)

    monkeypatch.setattr(SweepStore, "append", interrupted_after_writing_three)
    with pytest.raises(SweepInterrupted) as stop:
        sweep_heads(small_model, metric="repeat", heads=heads, out=tmp_path / "sweep")
    on_disk = (tmp_path / "sweep" / "rows.jsonl").read_text().splitlines()
    assert stop.value.n_done == len(on_disk) == 3


def test_incomplete_checkpoint_is_one_line_without_the_load_report(small_model_dir, tmp_path, sentinel, capfd):
    """Weights missing from model.safetensors: one line, and transformers' coloured LOAD REPORT table
    never reaches the terminal (the real stderr, read at the file descriptor)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "incomplete"
    shutil.copytree(small_model_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    dropped = sorted(name for name in tensors if name.endswith("mlp.c_fc.weight"))
    save_file({k: v for k, v in tensors.items() if k not in dropped}, folder / "model.safetensors", {"format": "pt"})
    line = refused("heads", "0.0", folder, sentinel=sentinel)
    assert f"lacks {len(dropped)} weights" in line
    assert "LOAD REPORT" not in capfd.readouterr().err
