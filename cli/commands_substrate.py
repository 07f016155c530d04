"""Commands of the substrate: `headlens validate`, `headlens heads`."""

from __future__ import annotations

import click


@click.command("heads")
@click.argument("spec")
@click.option("--model", "model_name", default="tiny", show_default=True, help="model name or directory")
def heads_command(spec: str, model_name: str) -> None:
    """Parse a head SPEC (L.H,L.H | layer:L | all) against MODEL and print the heads."""
    from headlens.heads import format_heads, parse_heads
    from headlens.models import load_model

    loaded = load_model(model_name)
    click.echo(format_heads(parse_heads(spec, loaded.spec.n_layers, loaded.spec.n_heads)))


COMMANDS = [heads_command]
