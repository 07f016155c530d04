"""`headlens --version`, `headlens heads`, `headlens validate`: outputs, exit codes, every error path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from headlens import __version__
from headlens.cli.main import cli
from headlens.load.models import load_model
from headlens.validate import BUILTIN_TEXT


@pytest.fixture()
def runner():
    return CliRunner()


@pytest.fixture()
def short_text(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text(BUILTIN_TEXT, encoding="utf-8")
    return str(path)


def assert_one_line_error(result, fragment: str) -> None:
    """Exit 2, exactly one line on stderr naming the problem, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("headlens: error:") and fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_version(runner):
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.stdout


def test_heads_prints_the_parsed_heads(runner, small_model_dir):
    result = runner.invoke(cli, ["heads", "1.3, 0.1", "--model", str(small_model_dir)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "0.1,1.3"
    result = runner.invoke(cli, ["heads", "layer:1", "--model", str(small_model_dir)])
    assert result.stdout.strip() == "1.0,1.1,1.2,1.3"


def test_validate_passes_table(runner, small_model_dir, short_text):
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--text", short_text])
    assert result.exit_code == 0, result.stderr
    assert "of given" in result.stdout
    for word in ("hf_eager", "sdpa", "transformer_lens", "pattern", "attn_out"):
        assert word in result.stdout
    assert "FAIL" not in result.stdout


def test_validate_json(runner, small_model_dir, short_text):
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--text", short_text, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["passed"] is True and payload["text_source"] == "given"
    assert len(payload["rows"]) == 16
    assert set(payload["rows"][0]) == {"layer", "quantity", "reference", "max_abs_error", "tolerance", "passed"}


@pytest.mark.slow
def test_validate_exits_1_when_a_weight_is_perturbed(runner, small_model_dir, short_text, monkeypatch):
    """Proof the check can fail: mha.py gets a wrong W_QKV for layer 0 -> exit 1, table still printed."""
    from headlens.arch.mha import CausalSelfAttention

    original = CausalSelfAttention.from_gpt2.__func__

    def from_gpt2(cls, attn, config, layer_idx):
        module = original(cls, attn, config, layer_idx)
        if layer_idx == 0:
            with torch.no_grad():
                module.c_attn.weight[:, 0] += 0.05
        return module

    monkeypatch.setattr(CausalSelfAttention, "from_gpt2", classmethod(from_gpt2))
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--text", short_text])
    assert result.exit_code == 1
    assert "FAIL" in result.stdout
    assert result.stderr.strip().startswith("headlens: validation failed:")
    assert len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--text", short_text, "--format", "json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["passed"] is False


# Errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("3.x", "malformed head"),
        ("1.4", "out of range"),
        ("2.0", "2 layers x 4 heads"),
        ("0.1,0.1", "more than once"),
        ("", "empty head spec"),
        ("0.1,,0.2", "empty entry"),
    ],
)
def test_heads_errors(runner, small_model_dir, spec, fragment):
    assert_one_line_error(runner.invoke(cli, ["heads", spec, "--model", str(small_model_dir)]), fragment)


def test_missing_model_dir(runner, tmp_path):
    missing = str(tmp_path / "no_model")
    assert_one_line_error(runner.invoke(cli, ["heads", "0.0", "--model", missing]), "no such model directory")
    assert_one_line_error(runner.invoke(cli, ["validate", missing]), "no such model directory")


def test_corrupt_weights(runner, small_model_dir, tmp_path, short_text):
    broken = shutil.copytree(small_model_dir, tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_one_line_error(runner.invoke(cli, ["validate", str(broken), "--text", short_text]), "corrupt")
    assert_one_line_error(runner.invoke(cli, ["heads", "0.0", "--model", str(broken)]), "corrupt")


def test_hub_id_offline_without_cache(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(runner.invoke(cli, ["validate", "gpt2"]), "not in the Hugging Face cache")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"", "is empty"),
        (b"  \n\t\n", "only white space"),
        (b"caf\xe9 au lait\n", "not valid UTF-8"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "binary"),
        (bytes(range(1, 32)) * 20, "binary"),
    ],
)
def test_validate_bad_text_file(runner, small_model_dir, tmp_path, content, fragment):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    assert_one_line_error(runner.invoke(cli, ["validate", str(small_model_dir), "--text", str(path)]), fragment)


def test_validate_missing_text_file(runner, small_model_dir, tmp_path):
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--text", str(tmp_path / "nope.txt")])
    assert_one_line_error(result, "not found")


def test_validate_text_too_short_for_a_window(runner, small_model_dir, tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a", encoding="utf-8")
    assert_one_line_error(runner.invoke(cli, ["validate", str(small_model_dir), "--text", str(path)]), "too short")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["ablate", "tiny", "--heads", "0.0", "--format", "xml"], "unknown format 'xml'"),
        (["prune", "tiny", "--format", "csv"], "unknown format 'csv'"),
        (["classify", "tiny", "--format", "yaml"], "unknown format 'yaml'"),
        (["validate", "tiny", "--format", "csv"], "unknown format 'csv'"),
        (["ablate", "tiny", "--bogus"], "No such option '--bogus'"),
        (["ablate", "tiny"], "Missing option '--heads'"),
        (["heads", "0.0", "tiny", "--model", "gpt2"], "two models given"),
        (["no-such-command"], "No such command"),
    ],
)
def test_every_usage_error_is_one_line(args, needle):
    """Bad options, values and commands: one line on stderr, exit 2, on every command alike."""
    proc = subprocess.run(
        [sys.executable, "-m", "headlens.cli.main", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("headlens: error:"), proc.stderr


@pytest.mark.slow
def test_model_is_positional_with_a_model_alias():
    """`heads SPEC MODEL` and `heads SPEC --model MODEL` parse the same heads against the same model."""
    runner = CliRunner()
    positional = runner.invoke(cli, ["heads", "all", "tiny"])
    alias = runner.invoke(cli, ["heads", "all", "--model", "tiny"])
    assert positional.exit_code == 0 and alias.exit_code == 0
    spec = load_model("tiny").spec
    expected = ",".join(f"{layer}.{head}" for layer in range(spec.n_layers) for head in range(spec.n_heads))
    assert positional.output == alias.output == expected + "\n"
