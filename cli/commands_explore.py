"""`headlens explore`: a live local page where one types a text and watches every head of the model.

A thin shell: load the model, read its classification (`--labels`, or computed once per model and
cached: headlens.classify.cache), then serve headlens.reports.explore on 127.0.0.1 until Ctrl-C (exit 0).
It prints the address with the server's token and opens nothing by itself. A port already taken is one
line naming it; names from a model file reach the terminal with control characters escaped.
"""

from __future__ import annotations

import errno
import socket
import sys

import click

from headlens.bounds import printable
from headlens.cli.options import lang_option, model_argument, placement_options, progress_option
from headlens.errors import ConfigError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
BACKUPS_HELP = (
    "the JSON of `headlens circuit MODEL --backups --format json`: each backup's head panel says what it backs up"
)


@click.command("explore")
@model_argument("tiny")
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), metavar="N", help="port (0: a free one)"
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    metavar="H",
    help="address to listen on; anything but loopback lets other machines use the page (a warning says so)",
)
@click.option(
    "--labels",
    "labels_path",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="heads.json / heads.csv from `headlens classify` [default: classify the model once, cached]",
)
@click.option("--backups", "backups_path", type=click.Path(dir_okay=False), metavar="FILE", help=BACKUPS_HELP)
@lang_option
@click.option(
    "--max-tokens",
    default=512,
    show_default=True,
    type=click.IntRange(2, 8192),
    metavar="N",
    help="longest text the page takes, in tokens (also capped by the model's context)",
)
@progress_option
@placement_options
def explore_cmd(model, port, host, labels_path, backups_path, lang, max_tokens, progress, placement):
    """Serve a live page: type a text, watch every head, remove heads and see what changes."""
    from headlens.circuits.backups import read_backups
    from headlens.classify.cache import cached_classification, read_classification
    from headlens.load.models import load_model
    from headlens.reports.explore import Explorer, create_app
    from headlens.reports.explore.serve import entry, is_loopback, serve

    frame = read_classification(labels_path) if labels_path else None
    backups = read_backups(backups_path) if backups_path else None
    sock = _listen(host, port)  # a taken port fails here, before the model loads
    try:
        loaded = load_model(model, **placement)
        if frame is None:
            name = printable(loaded.display_name)
            click.echo(f"headlens: classifying {name} (once per model, then cached)", err=True)
            frame = cached_classification(loaded, progress=progress)
        app = create_app(Explorer(loaded, frame, max_tokens=max_tokens, backups=backups), lang, hosts=(host,))
        if not is_loopback(host):
            click.echo(
                f"headlens: warning: listening on {printable(host)}, not loopback: anyone who can reach this "
                "machine and has the address below can use the model and see what is typed",
                err=True,
            )
        click.echo(f"headlens explore: {entry(sock, app.token)} (Ctrl-C stops)", err=True)
        serve(app, sock)
    except KeyboardInterrupt:  # Ctrl-C before the server started (while loading or classifying)
        click.echo("headlens explore: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        sock.close()
    click.echo("headlens explore: stopped", err=True)


def _listen(host: str, port: int) -> socket.socket:
    """The bound socket, or one line saying why not (a taken port named, with the way out)."""
    from headlens.reports.explore.serve import bind

    try:
        return bind(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} is in use on {printable(host)}; choose another with --port") from None
        raise ConfigError(f"cannot listen on {printable(host)} port {port}: {exc.strerror or exc}") from None


COMMANDS = [explore_cmd]
