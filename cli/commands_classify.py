"""`headlens classify`: a thin shell over headlens.classify.request: one `ClassifySpec`, one call, `run_classify`
(with `--compare-texts`, headlens.classify.compare's classification of each text and their comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from headlens.classify.kinds import DEFAULT_MAX_WINDOWS, DEFAULT_TOKEN_BUDGET, TABLE_COLUMNS, THRESHOLDS
from headlens.classify.stability import N_RESAMPLES, STABLE_MIN
from headlens.cli import options as opt

FORMATS = ("table", "full", "csv", "json")  # table: the labelled heads and their evidence; full: every head
OUT_FILES = ("heads.csv", "heads.json")  # what --out-dir DIR receives
OUT_SUFFIXES = (".csv", ".json", ".html")  # --out FILE: every head and score, or the report
# The shortest period --seq-len accepts. With period T the induction target of a token sits T - 1 tokens back
# and its earlier copy T back: at T = 1 the previous token, the earlier copy and the induction target are one
# position, so previous-token, duplicate-token and induction heads cannot be told apart, and any head at the
# fixed offset -(T - 1) scores as an induction head. The minimum puts the induction target beyond every
# offset the positional test buckets (ClassifyConfig.max_offset = 8; Voita et al. 2019), so a positional
# head cannot pass for an induction head: T >= max_offset + 2 = 10 (Olsson et al. 2022 use 25).
MIN_SEQ_LEN = 10
# TABLE_COLUMNS (headlens.classify.kinds): the columns of the table view (every column goes to csv / json).
__all__ = ["COMMANDS", "TABLE_COLUMNS", "classify_command"]


def _check_seq_len(ctx, param, value):
    if value is not None and value < MIN_SEQ_LEN:
        raise click.BadParameter(
            f"{value} is below {MIN_SEQ_LEN}: at a shorter period a head that looks a fixed "
            f"number of tokens back (up to {MIN_SEQ_LEN - 2}, the positional test's reach) "
            "scores as an induction head, and at period 1 previous-token, duplicate-token and "
            "induction heads look the same"
        )
    return value


@click.command("classify")
@opt.model_argument("tiny")
@click.argument("compare_paths", nargs=-1, type=click.Path(path_type=str), metavar="[PATH...]")
@click.option(
    "--compare-texts",
    is_flag=True,
    help="classify on each PATH (default: the held-out English, Spanish and Python texts shipped with headlens) "
    "and print, per role, the heads on each text, their Jaccard overlap and the heads that flip",
)
@opt.text_option("the natural-text and needle probes' text, windows per document")
@opt.seed_option("seed of the random tokens and needles [default: 0]", default=None)
@click.option("--n-seq", type=int, default=None, help="repeated-random-token sequences [default: 8]")
@click.option(
    "--seq-len",
    type=int,
    default=None,
    callback=_check_seq_len,
    help=f"period T of the random segment [default: 25; at least {MIN_SEQ_LEN}, so the previous token, "
    "the earlier copy and the induction target are positions a positional head cannot confuse]",
)
@click.option(
    "--max-windows",
    type=int,
    default=None,
    help=f"natural-text windows scored at most [default: {DEFAULT_MAX_WINDOWS}]",
)
@click.option(
    "--token-budget",
    type=int,
    default=None,
    help=f"tokens per text window and repeated sequence, at most the model's context [default: {DEFAULT_TOKEN_BUDGET}]",
)
@click.option(
    "--needle-budget",
    type=int,
    default=None,
    help="tokens of the longest needle-in-a-haystack test, up to the model's context for long-context "
    "needles [default: the token budget]",
)
@click.option(
    "--needle-depths",
    type=click.IntRange(min=1),
    default=None,
    help="needle depths per test length (needle tests = depths x 3 lengths): more depths give retrieval labels "
    "that move less with the seed and the precision, at the needle probe's cost growing in step [default: 5]",
)
@click.option("--no-needles", is_flag=True, help="skip the needle-in-a-haystack probe (no retrieval_score)")
@click.option(
    "--syntax",
    "syntax_file",
    type=click.Path(path_type=str),
    default=None,
    help="CoNLL-U treebank for the syntactic-head probe, or 'sample' for the English one shipped with headlens "
    "[default: the probe does not run]",
)
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="NAME=VALUE",
    help=f"label threshold: {', '.join(th.name for th in THRESHOLDS)}",
)
@click.option(
    "--strict",
    is_flag=True,
    help=f"keep only stable labels: those the head keeps in at least {STABLE_MIN:.0%} of the bootstrap resamples",
)
@click.option(
    "--resamples",
    type=click.IntRange(min=0),
    default=None,
    help=f"bootstrap resamples of the score intervals and label stabilities, 0 for none [default: {N_RESAMPLES}]",
)
@opt.out_option(*OUT_SUFFIXES, what="every head and score (.csv, .json) or the HTML report (.html)")
@opt.out_dir_option(
    "out_dir", type=click.Path(path_type=str), default=None, help="folder to write heads.csv and heads.json into"
)
@opt.format_option(*FORMATS)
@opt.report_option("also write a self-contained HTML report to this file", path_type=str)
@opt.lang_option
@opt.progress_option
@opt.placement_options
@opt.batch_size_option(8)
@click.pass_context
def classify_command(
    ctx,
    model,
    compare_paths,
    compare_texts,
    text_path,
    seed,
    n_seq,
    seq_len,
    max_windows,
    token_budget,
    needle_budget,
    needle_depths,
    no_needles,
    syntax_file,
    thresholds,
    strict,
    resamples,
    out,
    out_dir,
    fmt,
    report_path,
    lang,
    progress,
    placement,
    batch_size,
):
    """Score and label every attention head of MODEL (default: the shipped tiny model)."""
    from headlens import distributed
    from headlens.classify.labels import rank_heads
    from headlens.classify.request import ClassifySpec, run_classify
    from headlens.load.models import load_model

    if compare_paths and not compare_texts:
        raise click.UsageError(f"unexpected argument {compare_paths[0]!r}: text paths follow --compare-texts")
    flags = {"seed": seed, "n_seq": n_seq, "seq_len": seq_len, "max_windows": max_windows}
    flags.update(token_budget=token_budget, needle_budget=needle_budget, needle_depths=needle_depths)
    flags.update(syntax=syntax_file, resamples=resamples)
    request = ClassifySpec.parse(
        text_path=None if compare_texts else text_path,
        thresholds=thresholds,
        needles=not no_needles,
        batch_size=batch_size,
        strict=strict or None,
        **flags,
    )
    if compare_texts:
        click.echo(_compare(model, compare_paths, request.config, placement, progress, fmt))
        return
    out_fmt = opt.check_out(out, OUT_SUFFIXES, lang)
    out_folder = _check_out_dir(out_dir) if out_dir is not None else None
    opt.check_report(report_path, lang)
    loaded = load_model(model, **placement)
    say = lambda line: click.echo(f"headlens: {line}", err=True)  # noqa: E731
    heads = run_classify(loaded, request, progress and distributed.is_main(), say)
    if not distributed.is_main():
        return  # rank 0 alone prints and writes
    _notes(heads, request.text)
    frame = heads.frame
    if out_folder is not None:
        _write_outputs(out_folder, frame)
        click.echo(f"headlens: wrote {out_folder / 'heads.csv'} and {out_folder / 'heads.json'}", err=True)
    if out_fmt in ("csv", "json"):
        from headlens.classify import head_records
        from headlens.files import write_out

        write_out(out, table=_csv_frame(frame), document=head_records(frame))
    for page in opt.html_pages(report_path, out, out_fmt):
        from headlens.reports import render_report
        from headlens.reports.i18n import t

        written = render_report(
            page,
            model_info=opt.model_info(loaded),
            heads=heads,
            command=opt.command_line(ctx),
            text_label=text_path or t("text_label.default", lang),
            lang=lang,
        )
        opt.say_written(written, out, _summary(frame))
    if out_fmt in ("csv", "json"):
        click.echo(f"{_summary(frame)}; wrote {out}")
    if out is not None:
        return
    click.echo(_render(rank_heads(frame), fmt))


def _compare(model, paths, config, placement, progress, fmt: str) -> str:
    """--compare-texts: per role, the heads on each text, their Jaccard overlap and the flipping heads, as
    short lines (cli.compare_lines) or, with --format json / csv, the comparison's table."""
    from headlens.classify.compare import compare_texts, read_texts, shipped_documents
    from headlens.cli.compare_lines import compare_lines
    from headlens.load.models import load_model

    texts = read_texts(paths) if paths else shipped_documents()  # a bad file fails here, before the model loads
    if len(texts) < 2:
        raise click.UsageError("--compare-texts needs at least two texts")
    table = compare_texts(load_model(model, **placement), texts, config, progress).frame
    if fmt == "json":
        return table.to_json(orient="records")
    if fmt == "csv":
        lists = [c for c in table.columns if c.startswith("heads_") or c in ("flips", "flip_scores")]
        return table.assign(**{c: [", ".join(v) for v in table[c]] for c in lists}).to_csv(index=False).rstrip("\n")
    if table.empty:
        return "no head carries a role on any text"
    return "\n".join(compare_lines(table, list(texts)))


def _notes(heads, text) -> None:
    """One stderr note per thing the user should know about the probes run (`heads`: classify_heads' Result)."""
    from headlens.classify import SOURCE_DEFAULT

    info = heads.meta["probes"]
    sizes = info["sizes"]
    if sizes["capped"]:
        click.echo(
            f"headlens: note: probes sized by a token budget, not the model's context of {sizes['n_ctx']}: "
            f"text windows and repeats of at most {sizes['window']} tokens, needle tests of at most "
            f"{sizes['needle_context']} (raise --token-budget / --needle-budget to go longer)",
            err=True,
        )
    if info.get("text_partly_read"):
        click.echo(
            f"headlens: note: scored {info['n_windows']} text windows from the start of the text; the rest "
            "was not read (raise --max-windows to score more)",
            err=True,
        )
    elif info["windows_capped"]:
        click.echo(
            f"headlens: note: scored {info['n_windows']} of {info['n_windows_available']} text windows "
            "(raise --max-windows to score more)",
            err=True,
        )
    reach = info.get("sliding_window")
    if reach is not None and not reach["probes_inside"]:
        click.echo(
            f"headlens: note: layers {','.join(map(str, reach['layers']))} attend within a sliding window of "
            f"{reach['window']} tokens; the longest probe sequence has {reach['longest_probe']}, so those "
            "heads are scored only on keys inside their window",
            err=True,
        )
    if "syntactic_missing" in info:
        click.echo(f"headlens: note: no syntactic-head scores: {info['syntactic_missing']}", err=True)
    if "ioi_missing" in info:
        click.echo(f"headlens: note: no name-mover scores: {info['ioi_missing']}", err=True)
    elif "ioi_logit_diff" in info:
        click.echo(
            f"headlens: note: the model's own IOI logit difference, logit(IO) - logit(S) at the last token, is "
            f"{info['ioi_logit_diff']:.2f} on average over {info['n_ioi_prompts']} prompts (IO above S in "
            f"{info['ioi_correct_share']:.0%}): name-mover labels read a task the model "
            f"{'does' if info['ioi_logit_diff'] > 0 else 'does not do'}",
            err=True,
        )
    if heads.meta["sources"]["needles"] == SOURCE_DEFAULT and text is not None:
        click.echo(
            "headlens: note: the text is too short for a needle-in-a-haystack test; the retrieval probe's "
            "haystack is the held-out text shipped with headlens (needles_source = default_text)",
            err=True,
        )
    _kind_notes(heads)


# What a probe with nothing to score found none of (its facts key in meta["probes"][label], the unit)
EMPTY_PROBE = {"rare_word": ("n_sentences", "sentences"), "syntactic": ("relations", "relations")}


def _kind_notes(heads) -> None:
    """Why each role no head earned is absent (headlens.classify.labels.absent_roles): the head highest on the
    kind's ranking score, its evidence beside the cut-offs; or that the probe had nothing to score."""
    from headlens.classify import kinds
    from headlens.classify.labels import absent_roles

    info = heads.meta["probes"]
    for absence in absent_roles(heads.frame, heads.meta):
        label = absence.label
        if absence.head is None:
            probe = kinds.BY_COLUMN[kinds.BY_LABEL[label].score].probe
            if f"{probe}_missing" in info:
                continue  # the reason has its own note above
            key, unit = EMPTY_PROBE.get(label, (None, "inputs"))
            if key is None or not (info.get(label) or {}).get(key):
                click.echo(f"headlens: note: no {label} heads: the probe found no {unit} to score", err=True)
            continue
        click.echo(f"headlens: note: no {label} heads: {absence.describe()}", err=True)


def _check_out_dir(out_dir: str):
    """Make --out-dir (parents too) and check it is a writable folder, before any work is done."""
    import os

    from headlens.errors import OutputPathError
    from headlens.files import check_target

    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"--out-dir {path} is a file: give a folder to write heads.csv and heads.json into")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create --out-dir folder {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write into --out-dir folder {path}: permission denied")
    for name in OUT_FILES:
        check_target(path / name)
    return path


def _write_outputs(out, frame) -> None:
    from headlens.files import write_atomic

    csv_name, json_name = OUT_FILES
    write_atomic(out / csv_name, _csv(frame))
    write_atomic(out / json_name, _json(frame) + "\n")


def _csv_frame(frame):
    """The frame with labels and borderline labels joined by ';' (empty for none), as its CSV holds them."""
    lists = {column: [";".join(v) for v in frame[column]] for column in ("labels", "borderline") if column in frame}
    return frame.assign(**lists)


def _csv(frame) -> str:
    """CSV with labels (and borderline labels) joined by ';' (empty for none), formula-like cells escaped
    (headlens.files.csv_text)."""
    from headlens.files import csv_text

    return csv_text(_csv_frame(frame))


def _summary(frame) -> str:
    """What `--out FILE` puts on stdout instead of the table: how many heads, how many per role, where."""
    counts: dict[str, int] = {}
    for labels in frame["labels"]:
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
    labelled = sum(1 for labels in frame["labels"] if labels)
    roles = ", ".join(f"{label} {n}" for label, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return f"{len(frame)} heads, {labelled} with a label" + (f" ({roles})" if roles else "")


def _json(frame) -> str:
    from headlens.classify import head_records

    return json.dumps(head_records(frame), indent=2)


def _render(frame, fmt: str) -> str:
    if fmt == "json":
        return _json(frame)
    if fmt == "csv":
        return _csv(frame).rstrip("\n")
    if fmt == "table":
        return _labelled_table(frame)
    table = frame[["layer", "head", "labels", *_full_columns(frame)]].copy()
    table.insert(0, "head_id", [f"{layer}.{head}" for layer, head in zip(table["layer"], table["head"], strict=True)])
    table["labels"] = [_marked(labels, frame, i) for i, labels in enumerate(table["labels"])]
    table = table.drop(columns=["layer", "head"]).rename(columns={"head_id": "head"})
    text = table.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="n/a")
    return text + _borderline_line(frame)


def _labelled_table(frame, width: int | None = None) -> str:
    """The heads with a label, each with the scores that earned it (headlens.classify.kinds evidence, short
    names, 3 significant figures), fitted to `width` columns (default: the terminal's, shutil.get_terminal_size, which
    reads COLUMNS): a long cell wraps onto the next line in its own column. A last line says how many heads
    carry none; `--format full` prints every head and score column."""
    import shutil
    import textwrap

    from headlens.classify.kinds import BY_LABEL

    rows = []
    for row in frame.itertuples():
        if not row.labels:
            continue
        evidence = dict.fromkeys(column for label in row.labels for column in BY_LABEL[label].evidence)
        values = {column: getattr(row, column, None) for column in evidence}
        shown = [_evidence(column, value) for column, value in values.items() if isinstance(value, (int, float))]
        weak = frame["borderline"].iloc[row.Index] if "borderline" in frame else []
        labels = [label + (BORDERLINE_MARK if label in weak else "") for label in row.labels]
        rows.append((f"{row.layer}.{row.head}", labels, shown))
    footer = f"{len(rows)} of {len(frame)} heads carry a label (--format full: every head, every score)"
    footer += _borderline_line(frame)
    if not rows:
        return footer
    width = width or shutil.get_terminal_size((100, 24)).columns
    return "\n".join([*_fit([("head", ["labels"], ["scores"]), *rows], width), textwrap.fill(footer, width)])


def _evidence(column: str, value) -> str:
    """`prefix_matching 0.812`: a score's name without its `_score`, the value as the report writes it (3
    significant figures, headlens.reports.i18n.quantity; an integer as it is)."""
    from headlens.reports.i18n import quantity

    name = column.removesuffix("_score")
    return (
        f"{name} {int(value)}"
        if isinstance(value, int) or column == "positional_offset"
        else f"{name} {quantity(value)}"
    )


def _fit(rows: list[tuple[str, list[str], list[str]]], width: int) -> list[str]:
    """Rows of three left-aligned columns within `width` characters: the first as wide as its widest cell, the
    second at most a third of the width (or its longest label), the last what is left (at least 20); the items
    of a longer cell go on as many lines as they need."""
    first = max(len(row[0]) for row in rows)
    longest = max(len(item) + 1 for row in rows for item in row[1])  # one label and its comma, never split
    second = min(max(len(", ".join(row[1])) for row in rows), max(longest, (width - first - 4) // 3))
    third = max(20, width - first - second - 4)
    lines = []
    for head, labels, scores in rows:
        left, right = _wrap_items(labels, second), _wrap_items(scores, third)
        for i in range(max(len(left), len(right))):
            cells = (head if i == 0 else "", left[i] if i < len(left) else "", right[i] if i < len(right) else "")
            lines.append(f"{cells[0]:<{first}}  {cells[1]:<{second}}  {cells[2]}".rstrip())
    return lines


def _wrap_items(items: list[str], width: int) -> list[str]:
    """`items` joined by ', ' into lines of at most `width` characters where they fit (an item is never split)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) < width:  # room for the comma that may follow
            lines[-1] += ", " + item
        else:
            if lines:
                lines[-1] += ","
            lines.append(item)
    return lines or [""]


BORDERLINE_MARK = "~"  # after a label whose stability is below STABLE_MIN


def _marked(labels, frame, index) -> str:
    """A head's labels joined, each borderline one marked with BORDERLINE_MARK ("-" for none)."""
    weak = frame["borderline"].iloc[index] if "borderline" in frame else []
    return ", ".join(label + (BORDERLINE_MARK if label in weak else "") for label in labels) or "-"


def _borderline_line(frame) -> str:
    """The line saying what the mark means, when some label carries it."""
    if "borderline" not in frame or not any(
        set(w) & set(v) for w, v in zip(frame["borderline"], frame["labels"], strict=True)
    ):
        return ""
    return (
        f"\n{BORDERLINE_MARK} borderline: the head keeps this label in fewer than {STABLE_MIN:.0%} of the bootstrap "
        "resamples of its probes' units (<label>_stability); --strict keeps only stable labels"
    )


def _full_columns(frame) -> list[str]:
    """The score columns of `--format full`: each table score with its 95% interval, then the stability of
    every label some head carries."""
    columns = [c for column in TABLE_COLUMNS for c in (column, f"{column}_lo", f"{column}_hi") if c in frame]
    carried = dict.fromkeys(label for labels in frame["labels"] for label in labels)
    return columns + [f"{label}_stability" for label in carried if f"{label}_stability" in frame]


COMMANDS = [classify_command]
