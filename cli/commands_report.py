"""`headlens report`: classify, validate, (optionally) ablate, then write one HTML page.

A thin shell: every number comes from a library call; `headlens.reports.render_report` draws it.
"""

from __future__ import annotations

import click

from headlens.cli.options import (
    SEED,
    command_line,
    lang_option,
    model_argument,
    model_info,
    placement_options,
    progress_option,
    text_option,
)


def training_logs(loaded):
    """(log_df, heads_df) when the model folder holds a training log (the shipped tiny model does)."""
    from headlens.training import load_training_log

    folder = loaded.path
    if folder is None or not (folder / "training_log.csv").is_file() or not (folder / "training_heads.csv").is_file():
        return None
    return load_training_log(folder)


def chosen_ablations(loaded, heads, text, seed: int, progress: bool, sweep=None) -> list[dict]:
    """Each chosen head alone (read from the sweep when one was run), then all of them together."""
    from headlens.ablation.ablate import ablate_heads
    from headlens.ablation.metrics import UNIT

    if sweep is not None:
        rows = sweep.set_index(["layer", "head"])
        results = []
        for head in heads:
            row = rows.loc[tuple(head)]
            delta = float(row["delta_loss"])
            results.append(
                {
                    "heads": [str(head)],
                    "method": "zero",
                    "metric": "loss",
                    "unit": UNIT["loss"],
                    "n_tokens": int(row["n_tokens"]),
                    "delta": delta,
                    "delta_loss": delta,
                    "ci95": [float(row["ci95_low"]), float(row["ci95_high"])],
                }
            )
    else:
        results = [ablate_heads(loaded, [head], text=text, seed=seed, progress=progress) for head in heads]
    if len(heads) > 1:
        results.append(ablate_heads(loaded, heads, text=text, seed=seed, progress=progress))
    return results


@click.command("report")
@model_argument("tiny")
@text_option("the text classified, validated and ablated, windows per document (the viewer shows the first)")
@click.option("--heads", "heads_spec", default=None, help="heads to ablate: L.H,L.H | layer:L | all")
@click.option("--sweep", is_flag=True, help="also ablate every head alone (slower)")
@click.option("--prune", is_flag=True, help="also compute the pruning curve (Michel et al. 2019; slower)")
@click.option(
    "--out",
    "out",
    default="out/report.html",
    show_default=True,
    type=click.Path(),
    help="the HTML file to write (replaced atomically)",
)
@click.option(
    "--viewer-tokens",
    default=None,
    type=click.IntRange(2, 1024),
    help="tokens of the sample in the viewer and thumbnails [default: 64 for GPT-2 small, more for "
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
@lang_option
@progress_option
@placement_options
@click.pass_context
def report_command(
    ctx, model, text_path, heads_spec, sweep, prune, out, viewer_tokens, seed, controls, lang, progress, placement
) -> None:
    """Classify every head of MODEL (default: tiny), validate the attention maths, and write one HTML page."""
    from headlens import distributed
    from headlens.classify import classify_heads
    from headlens.classify.samples import sample_patterns
    from headlens.heads import Head, parse_heads
    from headlens.load.models import load_model
    from headlens.probes.corpus import first_document, open_text
    from headlens.probes.inputs import default_text
    from headlens.reports import render_report
    from headlens.reports.i18n import t
    from headlens.reports.render import check_output_path
    from headlens.reports.viewer import default_viewer_tokens
    from headlens.validate import validate_model

    check_output_path(out, lang)  # fail before minutes of work, not after
    text = open_text(text_path) if text_path else None
    loaded = load_model(model, **placement)
    spec = loaded.spec
    chosen = parse_heads(heads_spec, spec.n_layers, spec.n_heads) if heads_spec else None
    heads = classify_heads(loaded, text=text, progress=progress)
    validation = validate_model(loaded, first_document(text), raise_on_failure=False)
    sweep_frame = None
    if sweep:
        from headlens.ablation.ablate import sweep_heads

        sweep_frame = sweep_heads(loaded, text=text, seed=seed, progress=progress)
    ablation = chosen_ablations(loaded, chosen, text, seed, progress, sweep_frame) if chosen else None
    labels = {Head(int(r.layer), int(r.head)): list(r.labels) for r in heads.itertuples()}
    if controls:
        from headlens.ablation.ablate import role_experiments

        roles = role_experiments(loaded, control=controls, seed=seed, labels=labels, progress=progress)
        ablation = (ablation or []) + roles or None
    pruning = None
    if prune:
        from headlens.ablation.prune import prune_curve

        pruning = prune_curve(loaded, text=text, progress=progress)
    n_sample = viewer_tokens or default_viewer_tokens(spec.n_layers, spec.n_heads, spec.n_ctx)
    if not distributed.is_main():
        return  # rank 0 alone writes
    path = render_report(
        out,
        model_info=model_info(loaded),
        heads=heads,
        sweep=sweep_frame,
        ablation=ablation,
        pruning=pruning,
        validation=validation,
        training=training_logs(loaded),
        viewer=sample_patterns(
            loaded,
            first_document(text) or default_text(),
            n_sample,
            repeat=True,
            induction_heads=[head for head, names in labels.items() if "induction" in names],
        ),
        command=command_line(ctx, keep=("out",)),
        text_label=text_path or t("text_label.default", lang),
        lang=lang,
    )
    click.echo(f"wrote {path}")


COMMANDS = [report_command]
