"""`headlens report`: parse the options, build the report's results once (headlens.reports.pipeline.build_report),
write one page per language asked for.

`--lang en,es` writes the first language to `--out` and each other one beside it, its code before the suffix
(out/report.html, out/report.es.html): every page is drawn from the same results, nothing runs twice.
"""

from __future__ import annotations

from pathlib import Path

import click

from headlens.cli.options import (
    SEED,
    check_out,
    command_line,
    model_argument,
    out_option,
    placement_options,
    progress_option,
    text_option,
)
from headlens.reports.languages import LANGS, check_lang


def parse_langs(ctx, param, value: str) -> tuple[str, ...]:
    """ "en,es" -> ("en", "es"), each checked (ConfigError naming the choices), duplicates dropped."""
    langs = [check_lang(part.strip()) for part in value.split(",")]
    return tuple(dict.fromkeys(langs))


def page_paths(out, langs: tuple[str, ...]) -> dict[str, Path]:
    """The page of each language: the first at `out`, the others at `out` with `.<lang>` before the suffix."""
    out = Path(out)
    paths = {langs[0]: out}
    for lang in langs[1:]:
        paths[lang] = out.with_name(f"{out.stem}.{lang}{out.suffix}")
    return paths


@click.command("report")
@model_argument("tiny")
@text_option("the text classified, validated and ablated, windows per document (the viewer shows the first)")
@click.option("--heads", "heads_spec", default=None, help="heads to ablate: L.H,L.H | layer:L | all")
@click.option("--sweep", is_flag=True, help="also ablate every head alone (slower)")
@click.option("--prune", is_flag=True, help="also compute the pruning curve (Michel et al. 2019; slower)")
@out_option(".html", default="out/report.html", what="the page (with several languages, the first one's)")
@click.option(
    "--viewer-tokens",
    default=None,
    type=click.IntRange(2, 1024),
    help="tokens of the sample in the viewer and thumbnails [default: 56 for GPT-2 small, more for "
    "smaller models, so the file stays small]",
)
@click.option("--seed", default=0, show_default=True, type=SEED, help="seed of the ablation bootstrap")
@click.option(
    "--controls",
    default=20,
    show_default=True,
    type=click.IntRange(0, 1000),
    help="induction heads on repeat and retrieval heads on needle, each against this many random head "
    "sets of the same per-layer counts (0: skip)",
)
@click.option(
    "--lang",
    "langs",
    default="en",
    show_default=True,
    callback=parse_langs,
    metavar="|".join(LANGS) + "[,...]",
    help="language(s) of the page, comma-separated: the first is written to --out, each other one beside it "
    "as NAME.<lang>.html, all from one run",
)
@progress_option
@placement_options
@click.pass_context
def report_command(
    ctx, model, text_path, heads_spec, sweep, prune, out, viewer_tokens, seed, controls, langs, progress, placement
) -> None:
    """Classify every head of MODEL (default: tiny), validate the attention maths, and write one HTML page."""
    from headlens import distributed
    from headlens.load.models import load_model
    from headlens.probes.corpus import open_text
    from headlens.reports.pipeline import build_report

    paths = page_paths(out, langs)
    for lang, path in paths.items():
        check_out(str(path), (".html",), lang)  # fail before minutes of work, not after
    results = build_report(
        load_model(model, **placement),
        text=open_text(text_path) if text_path else None,
        text_label=text_path,
        heads_to_ablate=heads_spec,
        sweep=sweep,
        prune=prune,
        controls=controls,
        viewer_tokens=viewer_tokens,
        seed=seed,
        progress=progress,
        command=command_line(ctx, keep=("out",)),
    )
    if not distributed.is_main():
        return  # rank 0 alone writes
    for lang, path in paths.items():
        click.echo(f"wrote {results.render(path, lang)}")


COMMANDS = [report_command]
