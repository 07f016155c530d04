"""`headlens ablate` and `headlens prune`: thin shells over headlens.ablation.

Method and metric are checked by the library, the format by cli.options (one-line error, exit 2).
"""

from __future__ import annotations

import json

import click
from headlens.cli.options import (
    command_line,
    format_option,
    lang_option,
    model_argument,
    model_info,
    placement_options,
    progress_option,
)

FORMATS = ("table", "json")


def _row_object(model: str, method: str, metric: str, row) -> dict:
    """One sweep row as the JSON object of a single-head ablation."""
    return {"model": model, "heads": [f"{row['layer']}.{row['head']}"], "method": method, "metric": metric,
            "n_tokens": int(row["n_tokens"]), "loss": row["loss"], "loss_ablated": row["loss_ablated"],
            "delta_loss": row["delta_loss"], "ci95": [row["ci95_low"], row["ci95_high"]]}


def _write_json_atomic(path, obj) -> None:
    from headlens.files import write_atomic

    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def _print_frame(frame, fmt: str, to_objects) -> None:
    if fmt == "json":
        for row in frame.to_dict("records"):
            click.echo(json.dumps(to_objects(row)))
    else:
        click.echo(frame.to_string(index=False, float_format=lambda v: f"{v:.5f}"))


def _run_approx(loaded, heads, method, metric, text, seed, check, fmt, progress):
    from headlens.ablation.ablate import agreement, approx_sweep, sweep_heads

    approx = approx_sweep(loaded, method=method, metric=metric, text=text, seed=seed)
    keep = {(h.layer, h.head) for h in heads}
    approx = approx[[(r.layer, r.head) in keep for r in approx.itertuples()]].reset_index(drop=True)
    summary = None
    if check:
        exact = sweep_heads(loaded, method=method, metric=metric, text=text, seed=seed, progress=progress, heads=heads)
        approx = approx.merge(exact[["layer", "head", "delta_loss"]], on=["layer", "head"])
        summary = agreement(exact, approx)

    def to_obj(row):
        obj = {"model": str(loaded.name), "heads": [f"{row['layer']}.{row['head']}"], "method": method,
               "metric": metric, "n_tokens": int(row["n_tokens"]), "delta_loss_approx": row["delta_loss_approx"]}
        if "delta_loss" in row:
            obj["delta_loss"] = row["delta_loss"]
        return obj

    _print_frame(approx, fmt, to_obj)
    if summary is not None:
        if fmt == "json":
            click.echo(json.dumps({"check": summary}))
        else:
            click.echo(f"agreement with the exact sweep over {summary['n_heads']} heads: "
                       f"pearson {summary['pearson']:.4f}, spearman {summary['spearman']:.4f}")
    return approx


@click.command("ablate")
@model_argument("gpt2")
@click.option("--heads", "spec", required=True, help="L.H,L.H (together) | layer:L (together) | all (one at a time)")
@click.option("--method", default="zero", show_default=True, help="zero | mean | resample")
@click.option("--metric", default="text", show_default=True, help="text | repeat")
@click.option("--text", "text_path", type=click.Path(dir_okay=False), default=None,
              help="UTF-8 text for the text metric (default: the held-out text shipped with the tiny model)")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the bootstrap, probes and resampling")
@format_option(*FORMATS)
@click.option("--out", "out", default=None, type=click.Path(file_okay=False),
              help="directory: a sweep appends each finished head there (rows.jsonl, then sweep.csv)")
@click.option("--resume", is_flag=True, help="continue the sweep found in --out")
@click.option("--approx", is_flag=True, help="estimate each head's zero-ablation delta by attribution patching")
@click.option("--check", is_flag=True, help="with --approx: also run the exact sweep and report agreement")
@click.option("--report", "report_path", default=None, type=click.Path(), help="also write an HTML report")
@lang_option
@progress_option
@placement_options
def ablate_command(model, spec, method, metric, text_path, seed, fmt, out, resume, approx, check,
                   report_path, lang, progress, placement) -> None:
    """What does MODEL lose without these heads? Ablate them at z and measure the loss."""
    from headlens import distributed
    from headlens.ablation.ablate import ablate_heads, sweep_heads
    from headlens.ablation.evalset import check_choice
    from headlens.errors import ConfigError
    from headlens.heads import parse_heads
    from headlens.models import load_model
    from headlens.probes import read_text

    check_choice(method, metric)
    if check and not approx:
        raise ConfigError("--check compares --approx with the exact sweep: pass --approx too")
    if resume and out is None:
        raise ConfigError("--resume needs --out DIR (the directory of the interrupted sweep)")
    text = read_text(text_path) if text_path else None
    loaded = load_model(model, **placement)
    heads = parse_heads(spec, loaded.spec.n_layers, loaded.spec.n_heads)
    sweep = spec.strip().lower() == "all"
    name = str(loaded.name)
    sweep_df, ablation = None, None
    if approx:
        sweep_df = _run_approx(loaded, heads, method, metric, text, seed, check, fmt, progress)
    elif sweep:
        sweep_df = sweep_heads(loaded, method=method, metric=metric, text=text, seed=seed, progress=progress,
                               out=out, resume=resume)
        _print_frame(sweep_df, fmt, lambda row: _row_object(name, method, metric, row))
    else:
        ablation = ablate_heads(loaded, heads, method=method, metric=metric, text=text, seed=seed, progress=progress)
        if out is not None and distributed.is_main():
            from pathlib import Path

            Path(out).mkdir(parents=True, exist_ok=True)
            _write_json_atomic(Path(out) / "ablation.json", ablation)
        if fmt == "json":
            click.echo(json.dumps(ablation))
        else:
            for key, value in ablation.items():
                click.echo(f"{key:>13}  {value}")
    if report_path and distributed.is_main():
        from headlens.reports import render_report

        command = command_line(click.get_current_context())
        render_report(report_path, model_info=model_info(loaded), sweep=sweep_df, ablation=ablation,
                      command=command, lang=lang)


@click.command("prune")
@model_argument("gpt2")
@click.option("--text", "text_path", type=click.Path(dir_okay=False), default=None,
              help="UTF-8 text (default: the held-out text shipped with the tiny model)")
@click.option("--step-fraction", default=0.1, show_default=True, type=float, help="share of all heads per step")
@click.option("--seed", default=0, show_default=True, type=int)
@format_option(*FORMATS)
@click.option("--report", "report_path", default=None, type=click.Path(), help="also write an HTML report")
@lang_option
@progress_option
@placement_options
def prune_command(model, text_path, step_fraction, seed, fmt, report_path, lang, progress, placement) -> None:
    """Michel et al.'s pruning curve of MODEL: remove heads by importance, exact loss per step."""
    from headlens import distributed
    from headlens.ablation.prune import PRUNE_TOLERANCE, heads_within, prune_curve
    from headlens.models import load_model
    from headlens.probes import read_text

    text = read_text(text_path) if text_path else None
    loaded = load_model(model, **placement)
    curve = prune_curve(loaded, text=text, step_fraction=step_fraction, seed=seed, progress=progress)
    n_ok = heads_within(curve)
    n_total = loaded.spec.n_layers * loaded.spec.n_heads
    if fmt == "json":
        for row in curve.to_dict("records"):
            click.echo(json.dumps(row))
        click.echo(json.dumps({"heads_within_tolerance": n_ok, "n_heads": n_total, "tolerance": PRUNE_TOLERANCE}))
    else:
        click.echo(curve.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        click.echo(f"{n_ok} of {n_total} heads can go within +{PRUNE_TOLERANCE:.0%} loss "
                   f"(unpruned loss {curve['loss'].iloc[0]:.4f})")
    if report_path and distributed.is_main():
        from headlens.reports import render_report

        command = command_line(click.get_current_context())
        render_report(report_path, model_info=model_info(loaded), pruning=curve, command=command, lang=lang)


COMMANDS = [ablate_command, prune_command]
