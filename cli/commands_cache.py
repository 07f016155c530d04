"""`headlens cache list` and `headlens cache clear`: what headlens keeps in its cache (headlens.cache), per kind
and model with sizes, and removing it, as `pip cache` and `huggingface-cli delete-cache` do."""

from __future__ import annotations

import click

from headlens.cache import DEFAULT_MAX_GB, MAX_GB_ENV, VERSION, clear, entries, usage
from headlens.cli.options import format_option

kind_option = click.option(
    "--kind", type=click.Choice(list(VERSION)), default=None, help="only this kind of entry [default: every kind]"
)


@click.group(
    "cache",
    help=(
        "What headlens keeps in its cache (HEADLENS_CACHE, else $XDG_CACHE_HOME/headlens or ~/.cache/headlens): "
        "converted GGUF folders, classifications, vocabulary criteria and clean runs. At most "
        f"{MAX_GB_ENV} gigabytes (default {DEFAULT_MAX_GB:g}) are kept: the least recently used entries go first. "
        "Pulled GGUF files are not entries."
    ),
)
def cache_command() -> None:
    pass


@cache_command.command("list")
@kind_option
@format_option("table", "json")
def list_command(kind: str | None, fmt: str) -> None:
    """Entries per kind and model, with their sizes and when they were last used."""
    result = usage(kind)
    if fmt == "json":
        click.echo(result.to_json(indent=1))
        return
    meta = result.meta
    click.echo(f"cache: {meta['root']} ({_size(meta['total_bytes'])} of at most {_size(meta['max_bytes'])})")
    if not len(result):
        click.echo("no entries")
        return
    frame = result.frame.assign(size=[_size(n) for n in result.frame["bytes"]])
    click.echo(frame[["kind", "model", "entries", "size", "last_used"]].to_string(index=False))


@cache_command.command("clear")
@kind_option
@click.option("--yes", "-y", is_flag=True, help="do not ask before removing")
def clear_command(kind: str | None, yes: bool) -> None:
    """Remove headlens's entries (of --kind, else all of them); nothing else in the cache folder is touched."""
    found = entries(kind)
    what = f"{len(found)} {kind or 'cache'} entries ({_size(sum(e.size for e in found))})"
    if found and not yes:
        click.confirm(f"remove {what}?", abort=True, err=True)
    removed = clear(kind)
    click.echo(f"removed {len(removed)} entries ({_size(sum(e.size for e in removed))})")


def _size(n: int) -> str:
    """Bytes as B, kB, MB or GB (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


COMMANDS = [cache_command]
