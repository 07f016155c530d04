"""The second round of hostile tries: each finding performed, each refused at its cause with one line of at
most 300 characters and exit 2 (tests.helpers.hostile.refused), the message naming what was wrong, so a test
here fails if only the CLI's last-resort guard caught the error."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from headlens.files import shipped_path
from tests.helpers.hostile import make_sentinel, refused

DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = "1" * 5000  # past Python's 4,300-digit limit on converting a decimal string to int


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))


def short(line: str) -> str:
    assert 0 < len(line) <= 300, line
    return line


# Numbers: [0-9]+ only (`²` passes str.isdigit and fails int)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["heads", "0.²", "tiny"], "malformed head"),
        (["heads", "layer:²", "tiny"], "malformed head"),
        (["heads", "٣.1", "tiny"], "malformed head"),
        (["ablate", "tiny", "--heads", "0.0", "--control", "random:²"], "random:K"),
        (["ablate", "tiny", "--heads", "0.0", "--control", "random:" + DIGITS], "random:K"),
        (["ablate", "tiny", "--heads", "0.0", "--batch-size", "²"], "--batch-size"),
        (["ablate", "tiny", "--heads", "0.0", "--batch-size", DIGITS], "--batch-size"),
        (["ablate", "tiny", "--heads", "0.0", "--max-memory", "²=1GiB"], "--max-memory"),
        (["circuit", "tiny", "--seed", str(10**30)], "--seed"),
        (["ablate", "tiny", "--heads", "0.0", "--tokens", "٣٠٠٠"], "--tokens"),
    ],
    ids=[
        "head",
        "layer",
        "arabic-indic",
        "control",
        "control-digits",
        "batch",
        "batch-digits",
        "max-memory",
        "seed",
        "tokens",
    ],
)
def test_numbers(sentinel, args, said):
    assert said in short(refused(*args, sentinel=sentinel))


def test_treebank_ids_take_ascii_digits_only(tmp_path):
    from headlens.errors import InputTextError
    from headlens.probes.treebank import read_conllu

    path = tmp_path / "t.conllu"
    path.write_text("# text = a b\n1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n²\tb\t_\t_\t_\t_\t1\tdep\t_\t_\n\n")
    with pytest.raises(InputTextError, match=":3 is not CoNLL-U"):
        read_conllu(path)


# Error lines echo at most about 100 characters of the input


@pytest.mark.parametrize("spec", ["a" * 120_000, "0." + "9" * 120_000, "0.0," * 30_000 + "x"])
def test_long_head_spec_is_not_echoed_whole(sentinel, spec):
    line = short(refused("heads", spec, "tiny", sentinel=sentinel))
    assert "malformed head" in line


def test_long_model_name_is_not_echoed_whole(sentinel):
    short(refused("heads", "0.0", "x" * 120_000, sentinel=sentinel))


# JSON readers: deep nesting, 4,300+ digit integers, NaN / Infinity


def prompts_file(tmp_path, line: str):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    return path


@pytest.mark.parametrize(
    "line",
    [DEEP, '{"prompt": "a", "target": "b", "n": ' + DIGITS + "}", '{"prompt": "a", "target": "b", "x": NaN}'],
    ids=["deep", "digits", "nan"],
)
@pytest.mark.parametrize("command", ["ablate", "circuit"])
def test_prompts(tmp_path, sentinel, line, command):
    args = (
        ["ablate", "tiny", "--heads", "0.0", "--metric", "logit-diff"] if command == "ablate" else ["circuit", "tiny"]
    )
    line = short(refused(*args, "--prompts", prompts_file(tmp_path, line), sentinel=sentinel))
    assert "prompts.jsonl' line 1" in line


@pytest.mark.parametrize("text", [DEEP, '{"text": ' + DIGITS + "}"], ids=["deep", "digits"])
def test_jsonl_text(tmp_path, sentinel, text):
    path = tmp_path / "docs.jsonl"
    path.write_text(text + "\n")
    assert "docs.jsonl:1" in short(refused("classify", "tiny", "--text", path, sentinel=sentinel))


def test_ollama_manifest_nested_deep(tmp_path, sentinel):
    manifest = tmp_path / "store" / "manifests" / "registry.ollama.ai" / "library" / "evil" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(DEEP)
    assert "names no model layer" in short(refused("heads", "0.0", "ollama:evil", sentinel=sentinel))


def test_config_model_type_a_list(tmp_path, sentinel):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": ["gpt2"], "n_layer": 2}))
    assert "model_type" in short(refused("heads", "0.0", folder, sentinel=sentinel))


@pytest.mark.parametrize("digits", [DIGITS, "1e999"], ids=["int-digits", "float-overflow"])
def test_config_numbers(tmp_path, sentinel, digits):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2", "n_layer": ' + digits + "}")
    assert "config.json" in short(refused("heads", "0.0", folder, sentinel=sentinel))


# --labels: a regular file under a cap, read by schema, checked against the model


def labels_file(tmp_path, records) -> str:
    path = tmp_path / "heads.json"
    path.write_text(records if isinstance(records, str) else json.dumps(records))
    return str(path)


TINY_HEADS = [{"layer": layer, "head": head, "labels": []} for layer in range(2) for head in range(4)]


@pytest.mark.parametrize(
    ("records", "said"),
    [
        ('[{"layer": Infinity, "head": 0, "labels": []}]', "not valid JSON"),
        ('[{"layer": 1e999, "head": 0, "labels": []}]', "not valid JSON"),
        ([{**TINY_HEADS[0], "layer": 10**30}, *TINY_HEADS[1:]], "describes another model"),
        ([{**TINY_HEADS[0], "layer": -1}, *TINY_HEADS[1:]], "integers >= 0"),
        ([{**TINY_HEADS[0], "layer": 0.0}, *TINY_HEADS[1:]], "integers >= 0"),
        ([{**TINY_HEADS[0], "labels": "induction"}, *TINY_HEADS[1:]], "list of names"),
        (DEEP, "nests too deeply"),
        ("[" + DIGITS + "]", "not valid JSON"),
        ({"layer": 0}, "heads.json"),
    ],
    ids=[
        "infinity",
        "float-overflow",
        "huge-layer",
        "layer-minus-one",
        "layer-float",
        "labels-a-string",
        "deep",
        "digits",
        "an-object",
    ],
)
def test_labels_content(tmp_path, sentinel, records, said):
    path = labels_file(tmp_path, records)
    line = short(
        refused("ablate", "tiny", "--heads", "induction", "--metric", "repeat", "--labels", path, sentinel=sentinel)
    )
    assert said in line


def test_labels_layer_minus_one_never_picks_another_layer(tmp_path):
    """Library callers too: a head list with layer -1 is refused, never read as the last layer."""
    from headlens.classify.roles import resolve_heads
    from headlens.errors import InvalidHeadError
    from headlens.load.models import load_model

    loaded = load_model("tiny")
    with pytest.raises(InvalidHeadError, match="out of range"):
        resolve_heads(loaded, [(-1, 0)])
    with pytest.raises(InvalidHeadError, match="out of range"):
        resolve_heads(loaded, [(0, 4)])


def test_labels_device_is_refused_at_once(sentinel):
    assert "not a regular file" in short(
        refused("ablate", "tiny", "--heads", "induction", "--labels", "/dev/zero", sentinel=sentinel)
    )


def test_labels_fifo_is_refused_without_opening_it(tmp_path, sentinel):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would block forever: no writer
    line = short(refused("ablate", "tiny", "--heads", "induction", "--labels", fifo, sentinel=sentinel))
    assert "not a regular file" in line


def test_labels_over_the_cap(tmp_path, sentinel):
    from headlens.classify.roles import MAX_LABELS_BYTES

    path = tmp_path / "heads.json"
    with open(path, "wb") as handle:
        handle.truncate(MAX_LABELS_BYTES + 1)  # sparse: no disk used
    line = short(
        refused("ablate", "tiny", "--heads", "induction", "--metric", "repeat", "--labels", path, sentinel=sentinel)
    )
    assert "more than the" in line


# A tokenizer whose pattern cannot finish: Oniguruma's retry limit, then a Rust panic


def hostile_tokenizer_model(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(shipped_path("tiny"), folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    byte_level = tokenizer["pre_tokenizer"]
    split = {"type": "Split", "pattern": {"Regex": "(?=(a+)+b)"}, "behavior": "Isolated", "invert": False}
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def test_tokenizer_regex_past_the_retry_limit(tmp_path, sentinel, capfd):
    folder = hostile_tokenizer_model(tmp_path)
    text = tmp_path / "a.txt"
    text.write_text("a" * 60 + "!\n")
    line = short(refused("validate", folder, "--text", text, sentinel=sentinel))
    assert "tokenizer failed on this text" in line
    assert "panicked" not in capfd.readouterr().err  # Rust's panic lines held back, at the file descriptor


# The last-resort guard: one line naming the error type; HEADLENS_DEBUG=1 lets the traceback through


def test_guard_names_the_unexpected_error(monkeypatch, sentinel):
    import headlens.heads

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(headlens.heads, "parse_heads", broken)
    monkeypatch.setattr("headlens.cli.commands_substrate.parse_heads", broken, raising=False)
    line = short(refused("heads", "0.0", "tiny", sentinel=sentinel))
    assert "unexpected ZeroDivisionError" in line and "HEADLENS_DEBUG=1" in line
    from click.testing import CliRunner

    from headlens.cli.main import cli

    monkeypatch.setenv("HEADLENS_DEBUG", "1")
    result = CliRunner().invoke(cli, ["heads", "0.0", "tiny"])
    assert isinstance(result.exception, ZeroDivisionError)
