"""`headlens explore`: a live local page where one types a text and watches every head of the model.

A thin shell: load the model, read its classification (`--labels`, or computed once per model and
cached: headlens.classify.cache), then serve headlens.reports.explore on 127.0.0.1 until Ctrl-C. It
prints the address and opens nothing by itself.
"""

from __future__ import annotations

import click

from headlens.cli.options import lang_option, model_argument, placement_options, progress_option


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
@click.option(
    "--backups",
    "backups_path",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="the JSON of `headlens circuit MODEL --backups --format json`: each backup's head panel says what it backs up",
)
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
    from headlens.reports.explore.serve import address, bind, is_loopback, serve

    frame = read_classification(labels_path) if labels_path else None
    backups = read_backups(backups_path) if backups_path else None
    sock = bind(host, port)  # a taken port fails here, before the model loads
    try:
        loaded = load_model(model, **placement)
        if frame is None:
            click.echo(f"headlens: classifying {loaded.display_name} (once per model, then cached)", err=True)
            frame = cached_classification(loaded, progress=progress)
        app = create_app(Explorer(loaded, frame, max_tokens=max_tokens, backups=backups), lang)
        if not is_loopback(host):
            click.echo(
                f"headlens: warning: listening on {host}, not loopback: anyone who can reach this machine can "
                "use the model and see what is typed",
                err=True,
            )
        click.echo(f"headlens explore: {address(sock)} (Ctrl-C stops)", err=True)
        serve(app, sock)
    finally:
        sock.close()


COMMANDS = [explore_cmd]
