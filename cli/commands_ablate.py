"""`headlens ablate` and `headlens prune`: thin shells over headlens.ablation.

Method and metric are checked by the library, the format by cli.options (one-line error, exit 2).
`--format json` prints one JSON document on every path: an ablation's object, a sweep's or an
estimate's `{..., "rows": [...]}`, prune's `{"curve": [...], ...}`. Ctrl-C during a sweep says how
many heads were saved where, and exits 130.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from headlens.cli import options as opt

if TYPE_CHECKING:
    pass

FORMATS = ("table", "json")
OUT_SUFFIXES = (".csv", ".json", ".html")  # --out FILE: the rows, the document, or the HTML report
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's status for Ctrl-C


GENERIC_KEYS = ["n", "clean", "ablated", "delta"]
LOSS_KEYS = ["n_tokens", "loss", "loss_ablated", "delta_loss"]
ABOUT_KEYS = ["data", "reference", "resampled"]


def _row_object(model: str, method: str, metric: str, unit: str, row, about: dict) -> dict:
    """One sweep row as the JSON object of a single-head ablation (NaN CI bounds: null)."""
    ci = None if row["ci95_low"] != row["ci95_low"] else [row["ci95_low"], row["ci95_high"]]
    obj = {
        "model": model,
        "heads": [f"{row['layer']}.{row['head']}"],
        "method": method,
        "metric": metric,
        "unit": unit,
        **{key: row[key] for key in GENERIC_KEYS},
        "ci95": ci,
    }
    obj.update({key: row[key] for key in LOSS_KEYS if key in row})
    obj.update(about)
    return obj


def _write_json_atomic(path, obj) -> None:
    from headlens.files import write_atomic

    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def _print_frame(frame, fmt: str, to_objects, head: dict, tail: dict | None = None) -> None:
    """The frame as a table, or as one JSON document: `head`, then its rows (`to_objects`), then `tail`; with
    `--out FILE` (.csv: the frame, .json: the document) written there, and one summary line printed."""
    document = {**head, "rows": [to_objects(row) for row in frame.to_dict("records")], **(tail or {})}
    out = click.get_current_context().params.get("out")
    if out is not None and not out.lower().endswith(".html"):
        from headlens.files import write_out

        write_out(out, table=frame, document=document)
        delta = "delta_approx" if "delta_approx" in frame else "delta"
        top = frame.loc[frame[delta].abs().idxmax()] if len(frame) else None
        largest = "" if top is None else f"; the largest change: {top['layer']}.{top['head']} {_change(top[delta])}"
        click.echo(f"{len(frame)} heads, one at a time{largest}; wrote {out}")
    elif fmt == "json":
        click.echo(json.dumps(document))
    else:
        click.echo(frame.to_string(index=False, float_format=lambda v: f"{v:.5f}"))


def _show_approx(result, fmt: str) -> None:
    """An estimate's rows printed (a table or one JSON document, its trust summary last) or written to --out."""
    meta = result.meta
    head = {key: meta[key] for key in ("model", "method", "metric", "approx")}
    trust = {key: meta[key] for key in ("check", "trust") if key in meta}

    def to_obj(row):
        obj = {**{key: head[key] for key in ("model",)}, "heads": [f"{row['layer']}.{row['head']}"]}
        obj.update(method=head["method"], metric=head["metric"], approx=head["approx"], n=int(row["n"]))
        obj["delta_approx"] = row["delta_approx"]
        obj.update({key: row[key] for key in ("delta_loss_approx", "graddrop", "delta") if key in row})
        return obj

    _print_frame(result.frame, fmt, to_obj, head, trust)
    if fmt != "json":
        click.echo(_trust_line(head["approx"], next(iter(trust.values()))))


def _trust_line(kind: str, summary: dict) -> str:
    where = (
        "the exact sweep"
        if summary["kind"] == "check"
        else f"exact ablations of {summary['n_heads']} random heads on {summary['n_seq']} evaluation sequences"
    )
    return (
        f"{kind} vs {where}: spearman {summary['spearman']:.3f}, pearson {summary['pearson']:.3f}, "
        f"top-{summary['top_k']} overlap {summary['top10_overlap']:.2f}; of the exact top {summary['top_k']}, "
        f"{summary['top_flipped']} with the wrong sign, {summary['top_under']} under half their size "
        "(trust the estimate only as far as this)"
    )


def _control_line(control: dict) -> str:
    """How the chosen set compares with the control sets, and how many sets the design allows."""
    deltas = sorted(control["deltas"])
    drawn = (
        f"all {control['n_possible']} other sets with the same heads per layer (exact)"
        if control["exact"]
        else f"{control['k']} random sets of the {control['n_possible']} others with the same heads per layer "
        f"(seed {control['seed']})"
    )
    return (
        f"{drawn}: delta {deltas[0]:.5f} .. {deltas[-1]:.5f}, chosen set rank {control['rank']} of "
        f"{control['k'] + 1}, p = {control['p_value']:.3f} (smallest p possible {control['p_min']:.3f})"
    )


# Keys the text output leaves out: the loss metric's names for n, clean, ablated and delta (JSON keeps
# both), and those the summary line already states.
_LOSS_ALIASES = ("n_tokens", "loss", "loss_ablated", "delta_loss")
_IN_SUMMARY = ("model", "method", "unit", "ci95", "tokens", "tokens_read", "metric_why")
# Keys shown under a clearer name: "resampled" is what the bootstrap resampled, not --method resample.
_TEXT_NAMES = {"resampled": "bootstrap over"}


def _change(value: float) -> str:
    """A change, rounded to 3 significant digits, signed."""
    return f"{value:+.3g}"


def summary_line(ablation: dict) -> str:
    """One rounded line: which heads, the metric before and after, the change and its CI, the tokens read."""
    heads = ablation["heads"]
    named = ", ".join(heads) if len(heads) <= 8 else f"{len(heads)} heads"
    ci = ablation["ci95"]
    interval = f" (95% CI {_change(ci[0])} .. {_change(ci[1])})" if ci else " (no CI: one bootstrap unit)"
    budget = ablation.get("tokens", "all")
    budget_words = "no budget" if budget == "all" else f"budget {budget:,}"
    return (
        f"{ablation['model']}: {named} {ablation['method']}-ablated: {ablation['metric']} "
        f"{ablation['clean']:.4f} -> {ablation['ablated']:.4f} {ablation['unit']}, "
        f"delta {_change(ablation['delta'])}{interval}; {ablation['n']:,} scored positions, "
        f"{ablation.get('tokens_read', 0):,} tokens read ({budget_words})"
    )


def _print_ablation(ablation: dict) -> None:
    click.echo(summary_line(ablation))
    for key, value in ablation.items():
        if key in _LOSS_ALIASES or key in _IN_SUMMARY:
            continue
        name = _TEXT_NAMES.get(key, key)
        if key == "control":
            value = _control_line(value)
        elif key == "heads":
            value = ", ".join(value)
        elif isinstance(value, float):
            value = f"{value:.6g}"
        click.echo(f"{name:>14}  {value}")


@click.command("ablate")
@opt.model_argument("gpt2")
@click.option(
    "--heads",
    "spec",
    required=True,
    help="L.H,L.H | layer:L | all (every head) | a role: induction, retrieval, previous_token, "
    "duplicate_token, first_token, label:NAME: ablated together; each: every head alone (a sweep)",
)
@click.option("--method", default="zero", show_default=True, help="zero | mean | resample")
@click.option(
    "--metric",
    default=None,
    help="loss (= text) | repeat | logit-diff | prob | needle | needle-loss [default: a role's own metric "
    "(induction: repeat, retrieval: needle-loss, name_mover: logit-diff on IOI prompts), else loss]",
)
@opt.text_option("the text of the loss metric, windows per document (the needle metrics read one text file)")
@opt.prompts_option('JSONL, one {"prompt": ..., "target": ..., "foil": ...} per line (loss, logit-diff, prob)')
@click.option(
    "--reference",
    "reference_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="UTF-8 text that mean / resample ablation draw z from [default: the evaluation set itself]",
)
@click.option("--bos/--no-bos", default=True, show_default=True, help="prepend BOS to each text window")
@opt.labels_option("heads.json from `headlens classify --out-dir` for role heads [default: classify the model]")
@click.option("--control", default=None, help="random:K: the same ablation on K random head sets, same heads per layer")
@opt.seed_option("seed of bootstrap, probes, resampling, control")
@opt.format_option(*FORMATS)  # json: one document (a sweep's and --approx's rows under "rows")
@opt.out_option(*OUT_SUFFIXES, what="the ablation (.json), its rows (.csv) or the HTML report (.html)")
@opt.out_dir_option(
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="folder: a sweep appends each finished head there (rows.jsonl, then sweep.csv); an ablation writes "
    "ablation.json",
)
@click.option("--resume", is_flag=True, help="continue the sweep found in --out-dir")
@click.option(
    "--approx",
    default=None,
    is_flag=False,
    flag_value="atp",
    metavar="[atp|atp*]",
    help="estimate every single-head delta from gradients: atp (attribution patching) or atp* (AtP*)",
)
@click.option("--check", is_flag=True, help="with --approx: also run the exact sweep and report agreement")
@click.option("--graddrop", is_flag=True, help="with --approx: add AtP*'s GradDrop score (unsigned)")
@opt.report_option()
@opt.lang_option
@opt.progress_option
@opt.placement_options
@opt.tokens_option("4096; with --heads each 512")  # evalspec.DEFAULT_TOKENS, SWEEP_TOKENS
@opt.batch_size_option("4, or up to 1024 tokens of shorter sequences")  # evalset.BATCH_SIZE, BATCH_TOKENS
def ablate_command(
    model,
    spec,
    text_path,
    prompts_path,
    reference_path,
    labels_path,
    fmt,
    out,
    out_dir,
    report_path,
    lang,
    progress,
    placement,
    **flags,
) -> None:
    """What does MODEL lose without these heads? Ablate them at z and measure the metric.

    `--heads each` ablates every head alone (one row per head: `--out-dir` keeps each row, `--resume`
    continues); any other spec ablates its heads together. `--format json` prints one JSON document."""
    from headlens import distributed
    from headlens.ablation.request import AblateSpec, run_ablation
    from headlens.ablation.store import SweepInterrupted
    from headlens.classify.roles import read_labels
    from headlens.intervene.evalset import read_prompts
    from headlens.load.models import load_model
    from headlens.probes.corpus import open_text
    from headlens.probes.inputs import read_text

    out_fmt = opt.check_out(out, OUT_SUFFIXES, lang)  # fail before the work, not after
    opt.check_report(report_path, lang)
    if out_dir is not None:
        from headlens.ablation.store import check_sweep_dir

        check_sweep_dir(out_dir)  # fail before the work, not after
    request = AblateSpec.parse(
        spec,
        text=open_text(text_path) if text_path else None,
        prompts=read_prompts(prompts_path) if prompts_path else None,
        reference=read_text(reference_path) if reference_path else None,
        labels=read_labels(labels_path) if labels_path else None,
        out_dir=out_dir,
        **flags,  # method, metric, bos, control, seed, resume, approx, check, graddrop, tokens, batch_size
    )
    loaded = load_model(model, **placement)
    try:
        result = run_ablation(loaded, request, progress, say=lambda line: click.echo(f"headlens: {line}", err=True))
    except SweepInterrupted as stop:
        advice = "; rerun with --resume" if stop.directory is not None else ""
        click.echo(f"headlens: interrupted: {stop}{advice}", err=True)
        click.get_current_context().exit(EXIT_INTERRUPTED)
    if result.kind == "approx":
        _show_approx(result, fmt)
    elif result.kind == "sweep":
        _show_sweep(result, fmt)
    else:
        if out_dir is not None and distributed.is_main():
            from pathlib import Path

            Path(out_dir).mkdir(parents=True, exist_ok=True)
            _write_json_atomic(Path(out_dir) / "ablation.json", result.meta)
        _show_ablation(result.meta, fmt, out if out_fmt in ("csv", "json") else None)
    if not distributed.is_main():
        return
    for page in opt.html_pages(report_path, out, out_fmt):
        from headlens.reports import render_report

        command = opt.command_line(click.get_current_context())
        ablation = result if result.kind == "ablation" else None
        sweep = result if result.kind == "sweep" else None
        written = render_report(
            page, model_info=opt.model_info(loaded), sweep=sweep, ablation=ablation, command=command, lang=lang
        )
        say_line = summary_line(ablation.meta) if ablation is not None else "the sweep"
        opt.say_written(written, out, say_line)


def _show_ablation(meta: dict, fmt: str, out: str | None) -> None:
    """An ablation printed (a table or one JSON document), or written to `out` (.json: the document, .csv: one
    row) with its summary line printed."""
    if out is not None:
        import pandas as pd

        from headlens.files import write_out

        row = {key: ";".join(map(str, v)) if isinstance(v, list) else v for key, v in meta.items()}
        row = {key: json.dumps(v) if isinstance(v, dict) else v for key, v in row.items()}
        write_out(out, table=pd.DataFrame([row]), document=meta)
        click.echo(f"{summary_line(meta)}; wrote {out}")
    elif fmt == "json":
        click.echo(json.dumps(meta))
    else:
        _print_ablation(meta)


def _show_sweep(result, fmt: str) -> None:
    """A sweep's rows printed (a table or one JSON document) or written to --out, and what it measured."""
    from headlens.intervene.metrics import UNIT

    method = result.meta["method"]
    name, metric = result.meta["model"], result.meta["metric"]
    about = {key: result.meta[key] for key in ABOUT_KEYS}
    _print_frame(
        result.frame,
        fmt,
        lambda row: _row_object(name, method, metric, UNIT[metric], row, about),
        {"model": name, "method": method, "metric": metric, "unit": UNIT[metric], **about},
    )
    if fmt != "json":
        click.echo("; ".join(f"{_TEXT_NAMES.get(key, key)}: {about[key]}" for key in ABOUT_KEYS))


@click.command("prune")
@opt.model_argument("gpt2")
@opt.text_option("the text the loss is measured on, windows per document")
@click.option("--step-fraction", default=0.1, show_default=True, type=float, help="share of all heads per step")
@opt.labels_option("heads.json from `headlens classify --out-dir` [default: classify the model]")
@click.option(
    "--roles/--no-roles",
    default=True,
    show_default=True,
    help="mark labelled heads and test whether they are removed later (Voita et al. 2019)",
)
@opt.seed_option("seed of the removal-order permutation test")
@opt.format_option(*FORMATS)  # json: one document, the steps under "curve"
@opt.out_option(*OUT_SUFFIXES, what="the curve (.csv), its document (.json) or the HTML report (.html)")
@opt.report_option()
@opt.lang_option
@opt.progress_option
@opt.placement_options
@opt.tokens_option("4096")  # headlens.intervene.evalspec.DEFAULT_TOKENS
@opt.batch_size_option(4)  # headlens.intervene.evalset.BATCH_SIZE
def prune_command(
    model,
    text_path,
    step_fraction,
    labels_path,
    roles,
    seed,
    fmt,
    out,
    report_path,
    lang,
    progress,
    placement,
    tokens,
    batch_size,
) -> None:
    """Michel et al.'s pruning curve of MODEL: remove heads by importance, exact loss per step.

    `--format json` prints one JSON document: the steps under "curve", then the summary."""
    from headlens import distributed
    from headlens.ablation.request import run_pruning
    from headlens.classify.roles import read_labels
    from headlens.intervene.evalspec import DEFAULT_TOKENS, EvalSpec, parse_tokens
    from headlens.load.models import load_model
    from headlens.probes.corpus import open_text

    out_fmt = opt.check_out(out, OUT_SUFFIXES, lang)  # fail before the work, not after
    opt.check_report(report_path, lang)
    text = open_text(text_path) if text_path else None
    evaluation = EvalSpec(text=text, tokens=parse_tokens(tokens) if tokens is not None else DEFAULT_TOKENS)
    labels = read_labels(labels_path) if labels_path else None
    loaded = load_model(model, **placement)
    say = lambda line: click.echo(f"headlens: {line}", err=True)  # noqa: E731
    curve = run_pruning(loaded, evaluation, step_fraction, labels, roles, seed, batch_size, progress, say)
    if not distributed.is_main():  # every rank holds the same curve; rank 0 alone writes
        return
    meta = curve.meta
    document = {"curve": curve.frame.to_dict("records"), "heads_within_tolerance": meta["heads_within"]}
    document.update({key: meta[key] for key in ("n_heads", "tolerance", "removal_by_role")})
    n_ok, n_total, order = meta["heads_within"], meta["n_heads"], meta["removal_by_role"]
    within = f"{n_ok} of {n_total} heads can go within +{meta['tolerance']:.0%} loss"
    if out_fmt in ("csv", "json"):
        from headlens.files import write_out

        write_out(out, table=curve.frame, document=document)
        click.echo(f"{within}; wrote {out}")
    elif out_fmt is None and fmt == "json":
        click.echo(json.dumps(document))
    elif out_fmt is None:
        click.echo(curve.frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        click.echo(f"{within} (unpruned loss {curve.frame['loss'].iloc[0]:.4f})")
        click.echo(f"text: {curve.meta['data']}; importance on the odd windows, loss on the even ones")
        if order is not None:
            click.echo(_order_line(order))
    for page in opt.html_pages(report_path, out, out_fmt):
        from headlens.reports import render_report
        from headlens.reports.i18n import t

        written = render_report(
            page,
            model_info=opt.model_info(loaded),
            pruning=curve,
            command=opt.command_line(click.get_current_context()),
            text_label=text_path or t("text_label.default", lang),
            lang=lang,
        )
        opt.say_written(written, out, within)


def _order_line(order: dict) -> str:
    if order["p_value"] is None:
        return (
            f"removal order by role: {order['n_labelled']} labelled, {order['n_unlabelled']} unlabelled heads "
            "(no comparison: one group is empty)"
        )
    return (
        f"removal order by role: mean removal rank {order['mean_rank_labelled']:.2f} for the "
        f"{order['n_labelled']} labelled heads vs {order['mean_rank_unlabelled']:.2f} for the "
        f"{order['n_unlabelled']} unlabelled (1 = removed first); permutation p = {order['p_value']:.4f} "
        "for 'labelled heads are removed later'"
    )


COMMANDS = [ablate_command, prune_command]
