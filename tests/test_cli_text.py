"""`--text PATH` means the same on every command that takes it: a text file, a folder of .txt files or
a JSON Lines file with a text field (headlens.probes.corpus.open_text), with the same one-line refusals."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from headlens.cli.main import cli

# The commands that read a text, with the arguments each needs besides --text.
TEXT_COMMANDS = {
    "ablate": ["tiny", "--heads", "1.0"],
    "classify": ["tiny"],
    "prune": ["tiny"],
    "report": ["tiny"],
    "validate": ["tiny"],
}


def _commands() -> dict[str, click.Command]:
    """Every command of the CLI (the group loads each command's module on first use: headlens.cli.main)."""
    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}


def _text_param(name: str) -> click.Option:
    (param,) = [p for p in _commands()[name].params if "--text" in getattr(p, "opts", ())]
    return param


def test_every_command_that_reads_a_text_takes_the_same_option():
    with_text = {name for name, command in _commands().items() if any("--text" in p.opts for p in command.params)}
    assert with_text == set(TEXT_COMMANDS)
    for name in TEXT_COMMANDS:
        param = _text_param(name)
        assert isinstance(param.type, click.Path) and param.type.dir_okay and param.type.file_okay, name
        assert param.name == "text_path" and param.metavar == "PATH", name
        assert param.help.startswith("UTF-8 text file, folder of .txt files, or .jsonl with a text field"), name


def _bad_jsonl(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "a fine first document"}) + "\n{not json\n", encoding="utf-8")
    return path, f"{path}:2 is not valid JSON"


def _empty_folder(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    return folder, f"folder {folder} holds no .txt files"


@pytest.mark.parametrize("command", sorted(TEXT_COMMANDS))
@pytest.mark.parametrize("corpus", [_bad_jsonl, _empty_folder])
def test_a_bad_corpus_is_the_same_one_line_on_every_command(command, corpus, tmp_path):
    path, message = corpus(tmp_path)
    extra = ["--out", str(tmp_path / "r.html")] if command == "report" else []
    result = CliRunner().invoke(cli, [command, *TEXT_COMMANDS[command], "--text", str(path), *extra])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"headlens: error: {message}"), line


@pytest.mark.slow
def test_validate_reads_the_first_document_of_a_corpus(tmp_path):
    first = "The first document is this one, with a few words in it to validate."
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in (first, "A second one.")) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", "tiny", "--text", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    # tiny reads bytes: the first document's bytes and BOS, none of the second's
    assert (payload["text_source"], payload["n_tokens"]) == ("given", len(first.encode("utf-8")) + 1)
