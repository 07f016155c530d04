"""Commands of the substrate: `headlens validate`, `headlens heads`."""

from __future__ import annotations

import json
import sys

import click

from headlens.bounds import MAX_HEADS, MAX_LAYERS
from headlens.cli.options import check_out, format_option, model_argument, out_option, placement_options, text_option

EXIT_VALIDATION_FAILED = 1  # a genuine disagreement; bad input exits 2 (cli.main)
OUT_SUFFIXES = (".csv", ".json")  # validate --out FILE: the rows, or the document


@click.command("heads")
@click.argument("spec")
@model_argument("tiny")
def heads_command(spec: str, model: str) -> None:
    """Parse a head SPEC (L.H,L.H | layer:L | all) against MODEL and print the heads.

    On a model whose query heads share key/value heads (grouped- or multi-query attention), one
    more line per key/value head names the query heads of the SPEC that read it.
    """
    from headlens.classify.kinds import LABELS  # the registry alone: the labelling rules import pandas
    from headlens.errors import InvalidHeadError
    from headlens.heads import format_heads, parse_heads
    from headlens.load.models import load_model

    role = spec.strip().removeprefix("label:").strip()
    if role in LABELS:
        raise InvalidHeadError(
            f"{spec!r} is a role, not a list of heads: `headlens heads` takes L.H,L.H, layer:L or "
            f"all; roles are taken by ablate (headlens ablate {model} --heads {spec.strip()})"
        )
    parse_heads(spec, MAX_LAYERS, MAX_HEADS)  # a malformed spec fails before the model loads; ranges after
    loaded = load_model(model)
    model_spec = loaded.spec
    heads = parse_heads(spec, model_spec.n_layers, model_spec.n_heads)
    click.echo(format_heads(heads))
    if (model_spec.n_kv_heads or model_spec.n_heads) < model_spec.n_heads:
        groups: dict[tuple[int, int], list] = {}
        for head in heads:
            groups.setdefault((head.layer, model_spec.kv_group(head.head)), []).append(head)
        for (layer, group), members in groups.items():
            click.echo(f"kv_group {layer}.{group}: {format_heads(members)}")


def _format_table(frame) -> str:
    shown = frame.assign(
        max_abs_error=frame["max_abs_error"].map(lambda e: f"{e:.2e}"),
        tolerance=frame["tolerance"].map(lambda t: f"{t:.0e}"),
        passed=frame["passed"].map({True: "ok", False: "FAIL"}),
    )
    return shown.to_string(index=False)


@click.command("validate")
@model_argument("tiny")
@text_option(
    "the text run through each layer (a corpus: its first document)",
    "the shipped held-out text, else a built-in sentence",
)
@format_option("table", "json")
@out_option(*OUT_SUFFIXES, what="the comparison (.csv: its rows, .json: its document)")
@placement_options
def validate_command(model: str, text_path: str | None, fmt: str, out: str | None, placement: dict) -> None:
    """Check the from-scratch attention against HF eager, sdpa and TransformerLens, layer by layer.

    Prints the max absolute error per layer, quantity and reference; exits 0 only if every
    error is within tolerance, 1 if any is not, 2 on bad input.
    """
    from headlens.errors import ValidationFailed
    from headlens.load.models import load_model
    from headlens.probes.corpus import first_document, open_text
    from headlens.reports.facts import identical_note
    from headlens.validate import validate_model

    out_fmt = check_out(out, OUT_SUFFIXES)
    text = first_document(open_text(text_path)) if text_path is not None else None
    loaded = load_model(model, **placement)
    try:
        result, failure = validate_model(loaded, text), None
    except ValidationFailed as exc:
        result, failure = exc.result, exc
    frame, meta = result.frame, result.meta
    payload = {
        "model": model,
        "text_source": meta.get("text_source"),
        "n_tokens": meta.get("n_tokens"),
        "passed": failure is None,
        "dtype": meta.get("dtype"),
        "tolerance_rule": meta.get("tolerance_rule"),
        "rows": frame.to_dict(orient="records"),
    }
    if out_fmt is not None:
        from headlens.files import write_out

        write_out(out, table=frame, document=payload)
        failed = int((~frame["passed"]).sum())
        click.echo(f"{len(frame)} comparisons, {failed} beyond tolerance; wrote {out}")
    elif fmt == "json":
        click.echo(json.dumps(payload, indent=2))
    else:
        click.echo(
            f"model {model}: {meta.get('n_tokens')} tokens of {meta.get('text_source')}; {meta.get('tolerance_rule')}"
        )
        click.echo(_format_table(frame))
        click.echo(identical_note(frame, "en"))  # why a reference reads exactly 0, which one is independent
    if failure is not None:
        click.echo(f"headlens: validation failed: {failure}", err=True)
        sys.exit(EXIT_VALIDATION_FAILED)


COMMANDS = [heads_command, validate_command]
