"""A hostile tokenizer: a tokenizer.json whose regex exhausts Oniguruma's retry limit, after which the Rust
tokenizer panics (pyo3's PanicException, and Rust's panic hook writes its lines straight to file descriptor 2).
headlens calls a tokenizer only through headlens.probes.tokenize (encode, encode_offsets, decode: checked from
the source below), so every path gives one InputTextError line and none of the panic's lines: each call site of
the probes, tasks and the explorer is tried here with a tokenizer that panics on its input, and the commands
classify (its name-mover and syntactic probes included), ablate, validate and circuit refuse with one line of at
most 300 characters and exit 2 (tests.helpers.hostile.refused); the explorer's API answers one JSON line."""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import GPT2Config, PreTrainedTokenizerFast

from headlens.errors import InputTextError
from headlens.files import shipped_path
from headlens.load.models import build_model, gpt2_tokenizer, save_model
from tests.helpers import hostile
from tests.helpers.hostile import refused

ROOT = Path(__file__).resolve().parents[1]
# Panics on any piece of about five characters or more: nested quantifiers over alternatives that all match,
# before a lookbehind that never holds, so Oniguruma retries past its limit (a short name, " Tom", passes)
ANY = r"(?=(?:(?:.|.|.|.|.|.|.|.|.|.|.|.|.|.|.|.)+)+(?<=\x00))"
# Panics only on a piece holding " went" and some characters after it (the IOI templates, never the text below)
WENT = r"(?= went(.|.|.|.|.|.)*\x00)"
# Panics only on a piece holding "Moab" (sentences of the shipped treebank sample, never the text below)
MOAB = r"(?=Moab(.|.|.|.|.|.)*\x00)"
TEXT = "The quick brown fox jumps over the lazy dog. " * 64  # none of the triggers above
PANIC_LINES = ("panicked", "stack backtrace", "Onig")


# the shared fixtures (tests/helpers/hostile.py), as names of this module so pytest finds them
sentinel, fresh_cache = hostile.sentinel, hostile.fresh_cache
pytestmark = pytest.mark.usefixtures("fresh_cache")


def hostile_json(tokenizer_json: dict, pre: str | None = None, decoder: str | None = None) -> dict:
    """A copy of a tokenizer.json whose pre-tokenizer (and/or decoder) first applies the regex."""
    out = copy.deepcopy(tokenizer_json)
    if pre is not None:
        split = {"type": "Split", "pattern": {"Regex": pre}, "behavior": "Isolated", "invert": False}
        out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, out["pre_tokenizer"]]}
    if decoder is not None:
        replace = {"type": "Replace", "pattern": {"Regex": decoder}, "content": ""}
        out["decoder"] = {"type": "Sequence", "decoders": [out["decoder"], replace]}
    return out


def hostile_gpt2(pre: str | None = ANY, decoder: str | None = None) -> PreTrainedTokenizerFast:
    """GPT-2's tokenizer (it spells the IOI names, weekdays and years as single tokens) made hostile."""
    base = gpt2_tokenizer()
    made = hostile_json(json.loads(base.backend_tokenizer.to_str()), pre, decoder)
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(made)), bos_token=base.bos_token, eos_token=base.eos_token
    )


def hostile_folder(folder: Path, pre: str, gpt2: bool = False) -> Path:
    """A model folder whose tokenizer.json is hostile: tiny's, or a 2-layer random GPT-2 with GPT-2's tokenizer."""
    if gpt2:
        config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128)
        save_model(build_model(config, seed=0, tokenizer=gpt2_tokenizer(), name="small"), folder)
    else:
        shutil.copytree(shipped_path("tiny"), folder)
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(hostile_json(json.loads(path.read_text()), pre)))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"  # tokenizer.json as written (GPT2Tokenizer rebuilds its own)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def assert_quiet(capfd) -> None:
    err = capfd.readouterr().err
    assert not any(word in err for word in PANIC_LINES), err[:2000]


# -- every call site, with a tokenizer that panics on what it is given ------------------------------------------
def _name_tokens(tok):
    from headlens.scores.name_mover import name_tokens

    name_tokens(tok)


def _ioi_templates(tok):  # the names pass (single tokens), the templates' text pieces panic
    from headlens.scores.name_mover import ioi_prompts

    ioi_prompts(tok, tok.bos_token_id, n=4)


def _syntactic(tok):
    from headlens.probes.treebank import read_conllu, sample_path
    from headlens.scores.syntactic import align

    for sentence in read_conllu(sample_path()):
        align(tok, sentence, tok.bos_token_id)


def _rare_word(tok):
    from headlens.scores.rare_word import rare_sentence

    rare_sentence(tok, "Naomi and her daughter Ruth came to Bethlehem at the barley harvest.", 0, 64)


def _successor(tok):
    from headlens.scores.successor import successor_tasks

    successor_tasks(tok)


def _greater_than(tok):
    from headlens.circuits.moretasks import greater_than_task

    greater_than_task(build_model(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64), tokenizer=tok))


def _prompts_file(tok, tmp_path):
    from headlens.intervene.evalset import prompt_evalset, read_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "The capital of France is", "target": " Paris, the city of light"}) + "\n")
    loaded = build_model(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64), tokenizer=tok)
    prompt_evalset(loaded, read_prompts(path), "loss")


def _default_ids(tok):
    from headlens.classify.runs import default_ids

    default_ids(build_model(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64), tokenizer=tok))


@pytest.mark.parametrize(
    ("call", "pre"),
    [
        (_name_tokens, ANY),
        (_ioi_templates, WENT),
        (_syntactic, MOAB),
        (_rare_word, ANY),
        (_successor, ANY),
        (_greater_than, ANY),
        (_prompts_file, ANY),
        (_default_ids, ANY),
    ],
)
def test_each_call_site_turns_the_panic_into_one_error(call, pre, tmp_path, capfd):
    tok = hostile_gpt2(pre)
    with pytest.raises(InputTextError, match="tokenizer failed on this text"):
        call(tok, tmp_path) if call is _prompts_file else call(tok)
    assert_quiet(capfd)


def test_a_hostile_decoder_is_one_error(capfd):
    from headlens.probes.tokenize import decode

    tok = hostile_gpt2(pre=None, decoder=ANY)
    assert decode(tok, tok(" Tom")["input_ids"]) == " Tom"  # short enough for the pattern to finish
    with pytest.raises(InputTextError, match="tokenizer failed on these tokens"):
        decode(tok, tok(" Christopher and Mary went home")["input_ids"])
    assert_quiet(capfd)


def test_stderr_written_during_a_call_that_did_not_panic_still_reaches_the_terminal(capfd):
    import os

    from headlens.probes.tokenize import guarded

    assert guarded("this text", os.write, 2, b"kept\n") == 5
    assert capfd.readouterr().err == "kept\n"


def test_headlens_calls_a_tokenizer_only_through_probes_tokenize():
    """No call with `add_special_tokens=`, and no tokenizer method that runs the Rust library (tok.decode,
    tokenizer.encode, ...), outside headlens/probes/tokenize.py."""
    methods = {
        "decode",
        "encode",
        "batch_decode",
        "encode_batch",
        "encode_plus",
        "tokenize",
        "convert_tokens_to_string",
    }
    found = []
    for folder in ("headlens", "cli", "reports"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "headlens" / "probes" / "tokenize.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                method = isinstance(node.func, ast.Attribute) and node.func.attr in methods
                owner = ast.unparse(node.func.value).split(".")[-1] if method else ""
                on_tokenizer = owner in ("tok", "tokenizer", "backend_tokenizer", "_tokenizer")
                if on_tokenizer or "add_special_tokens" in {k.arg for k in node.keywords}:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, found


# -- the commands: one line, exit 2, no panic text on file descriptor 2 ----------------------------------------
@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_text(TEXT)
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("validate", "MODEL", "--text", "TEXT"),
        ("classify", "MODEL", "--text", "TEXT", "--resamples", "0"),
        ("ablate", "MODEL", "--heads", "0.0", "--text", "TEXT"),
        ("circuit", "MODEL", "--task", "induction"),
    ],
)
def test_commands_on_a_hostile_tokenizer(args, tmp_path, text_file, sentinel, capfd):
    model = hostile_folder(tmp_path / "model", ANY)
    args = [{"MODEL": model, "TEXT": text_file}.get(arg, arg) for arg in args]
    assert "tokenizer failed on this text" in refused(*args, sentinel=sentinel)
    assert_quiet(capfd)


@pytest.mark.parametrize(
    ("pre", "args"),
    [
        (ANY, ("circuit", "MODEL", "--task", "ioi")),  # the names
        (WENT, ("circuit", "MODEL", "--task", "ioi")),  # the templates' text
        (WENT, ("classify", "MODEL", "--text", "TEXT", "--resamples", "0", "--no-needles")),  # the name-mover probe
        (MOAB, ("classify", "MODEL", "--text", "TEXT", "--resamples", "0", "--syntax", "sample")),
    ],
)
def test_the_probes_own_sentences_on_a_hostile_tokenizer(pre, args, tmp_path, text_file, sentinel, capfd):
    model = hostile_folder(tmp_path / "model", pre, gpt2=True)
    args = [{"MODEL": model, "TEXT": text_file}.get(arg, arg) for arg in args]
    assert "tokenizer failed on this text" in refused(*args, sentinel=sentinel)
    assert_quiet(capfd)


def test_the_explorer_answers_one_json_line(tmp_path, capfd):
    from headlens.load.models import load_model
    from headlens.reports.explore import Explorer, create_app
    from tests.helpers.explore_setup import explore_client, tiny_setup

    loaded = load_model(str(hostile_folder(tmp_path / "model", ANY)))
    client = explore_client(create_app(Explorer(loaded, tiny_setup()[1])))
    response = client.post("/api/run", json={"text": TEXT[:200]})
    assert response.status_code == 422, response.text
    assert "tokenizer failed on this text" in response.json()["error"]
    run = client.post("/api/run", json={"text": "ab"})  # short enough for the pattern to finish
    assert run.status_code == 200, run.text
    direct = client.post("/api/direct", json={"run": run.json()["run"], "position": 1, "target": " Christopher"})
    assert direct.status_code == 422 and "tokenizer failed" in direct.json()["error"], direct.text
    assert_quiet(capfd)
