"""The README's command synopsis is the commands' own: regenerated from their click parameters, it must
equal the block in README.md (rewrite it with `python -m headlens.cli.synopsis README.md`)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from headlens.cli import synopsis
from headlens.cli.main import cli

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_synopsis_is_generated_from_the_commands():
    text = README.read_text(encoding="utf-8")
    assert synopsis.rewrite(text, synopsis.synopsis(cli)) == text, (
        "README.md's synopsis is stale: run python -m headlens.cli.synopsis README.md"
    )


def test_synopsis_names_every_option_of_every_command():
    block = synopsis.synopsis(cli)
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):  # the group loads each command's module on first use
        command = cli.get_command(ctx, name)
        assert f"headlens {name} " in block
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in synopsis.HIDDEN:
                assert param.opts[0] in block, (name, param.opts[0])


def test_a_new_option_changes_the_synopsis():
    """The detector itself: an option added to a command shows up, so a stale README fails the first test."""
    command = click.Command("demo", params=[click.Option(["--frobnicate"], type=int)])
    assert "[--frobnicate N]" in synopsis.command_synopsis("demo", command)
    with pytest.raises(ValueError, match="no synopsis markers"):
        synopsis.rewrite("no block here", "x")
