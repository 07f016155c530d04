"""`headlens circuit`: a thin shell over headlens.circuits.request: one `CircuitSpec`, one call, `run_circuit`.

`--format json` prints one JSON document (headlens.circuits.request.circuit_document): `heads`, `edges`,
`self_repair`; with `--discover` or `--circuit FILE` the circuit found on the whole graph (its lines are
headlens.cli.circuit_graph's). The table names the heads of largest direct effect with their labels, the unlabelled
ones (no role) among them, the strongest edges, and with `--ablate` the self-repair sentence and table.
"""

from __future__ import annotations

import json

import click

from headlens.circuits.faithfulness import DEFAULT_METHOD, DEFAULT_STEPS
from headlens.cli import options as opt

FORMATS = ("table", "json")
OUT_SUFFIXES = (".json", ".html")  # --out FILE: the document (heads, edges, self-repair) or the HTML report
SHOWN_HEADS = 12
SHOWN_EDGES = 12
SHOWN_COMPENSATION = 8


@click.command("circuit")
@opt.model_argument(default=None)
@click.option(
    "--task",
    "task_name",
    default="induction",
    show_default=True,
    metavar="induction|ioi|greater-than",
    help="induction: repeated random tokens; ioi: indirect-object prompts (logit(IO) - logit(S)); "
    "greater-than (with --discover or --circuit): P(later year) - P(earlier)",
)
@click.option(
    "--task-file",
    type=click.Path(dir_okay=False),
    default=None,
    help='with --discover/--circuit: JSONL of {"prompt", "answer(s)", "counterfactual", "wrong(_answers)"}',
)
@click.option("--discover", is_flag=True, help="find the circuit on the whole graph: nodes, edges, faithfulness")
@click.option("--edges", "n_edges", type=int, default=None, help="with --discover: keep the top N edges")
@click.option("--target", type=float, default=None, help="with --discover: smallest circuit with faithfulness F [0.8]")
@click.option(
    "--ablation",
    default="patching",
    show_default=True,
    metavar="patching|mean",
    help="with --discover/--circuit: edges outside the circuit carry the counterfactual run or the mean",
)
@click.option(
    "--circuit",
    "circuit_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="score the faithfulness of an EAP-IG/MIB graph JSON",
)
@click.option("--graph-out", type=click.Path(dir_okay=False), default=None, help="write the circuit as EAP-IG JSON")
@click.option("--no-stability", is_flag=True, help="with --discover: skip the resampled circuits")
@click.option(
    "--select",
    "selection",
    type=click.Choice(["top", "greedy", "signed"]),
    default="top",
    show_default=True,
    help="with --discover: the N largest |score| edges, grown greedily from the logits (EAP-IG's apply_greedy), "
    "or the N edges whose scores say they help the task most (EAP-IG's absolute=False)",
)
@opt.prompts_option('with --task ioi: JSONL of {"prompt", "target", "foil"} [default: headlens\'s IOI templates]')
@click.option("--ablate", "spec", default=None, help="heads (23.0,23.1) or a role: the self-repair table")
@click.option(
    "--method",
    default=None,
    metavar="zero|mean|resample / exact|eap|eap-ig",
    help=f"what an ablated head's z becomes [zero]; with --discover, how edges are scored [{DEFAULT_METHOD}]",
)
@click.option("--approx", default=None, metavar="eap|eap-ig|eap*", help="also score the edges by edge attribution")
@click.option("--steps", default=DEFAULT_STEPS, show_default=True, type=int, help="integration steps of eap-ig")
@opt.labels_option("heads.json from `headlens classify --out` [default: classify the model]")
@click.option(
    "--backups/--no-backups",
    "backups",
    default=None,
    help="also find the heads that make up for the task's role (name movers, induction heads) when it is ablated "
    "[default: with --discover, where some head carries the task's role]",
)
@click.option(
    "--control",
    "control",
    default="random:39",
    show_default=True,
    metavar="random:K",
    help="with --backups: K random head sets of the role's per-layer counts each head's compensation is tested on",
)
@opt.seed_option("seed of the task's inputs and resampling")
@opt.format_option(*FORMATS)
@opt.out_option(*OUT_SUFFIXES, what="the circuit's document (.json) or the HTML report (.html)")
@opt.report_option()
@opt.lang_option
@opt.progress_option
@opt.placement_options
def circuit_command(
    model,
    task_name,
    task_file,
    discover,
    n_edges,
    target,
    ablation,
    circuit_path,
    graph_out,
    no_stability,
    selection,
    prompts_path,
    spec,
    method,
    approx,
    steps,
    labels_path,
    backups,
    control,
    seed,
    fmt,
    out,
    report_path,
    lang,
    progress,
    placement,
) -> None:
    """How do MODEL's heads work together on a task? Direct effects, edges and self-repair."""
    from headlens.circuits.request import CircuitSpec, circuit_document, run_circuit
    from headlens.load.models import load_model

    request = CircuitSpec.parse(
        method=method,
        prompts_path=prompts_path,
        labels_path=labels_path,
        backups=backups,
        control=control,
        task=task_name,
        task_file=task_file,
        discover=discover,
        graph=circuit_path or None,
        edges=n_edges,
        target=target,
        ablation=ablation,
        graph_out=graph_out,
        stability=not no_stability,
        selection=selection,
        heads=spec,
        approx=approx,
        steps=steps,
        seed=seed,
    )
    out_fmt = opt.check_out(out, OUT_SUFFIXES, lang)  # fail before the work
    opt.check_report(report_path, lang)
    loaded = load_model(model, **placement)
    result = run_circuit(loaded, request, progress, say=lambda line: click.echo(f"headlens: {line}", err=True))
    info = opt.model_info(loaded)
    document = circuit_document(result, info)
    printer = _print_graph if request.on_graph else _print_circuit
    summary = printer(document, fmt, out, out_fmt)
    for page in opt.html_pages(report_path, out, out_fmt):
        from headlens.reports import render_report

        command = opt.command_line(click.get_current_context())
        written = render_report(page, model_info=info, circuits=[result], command=command, lang=lang)
        opt.say_written(written, out, summary)


def _print_circuit(document: dict, fmt: str, out: str | None, out_fmt: str | None) -> str:
    """The circuit's document on stdout (JSON or the table), or written to `--out FILE.json`; its summary."""
    summary = f"task {document['task']['name']}: {len(document['heads'])} heads, {len(document['edges'])} edges"
    if _written(document, summary, out, out_fmt) or out_fmt is not None:
        return summary
    if fmt == "json":
        click.echo(json.dumps(document))
    else:
        _print_document(document)
    return summary


def _print_graph(document: dict, fmt: str, out: str | None, out_fmt: str | None) -> str:
    """A circuit found on the whole graph on stdout (JSON, or its lines and the backups' table), or written to
    `--out FILE.json`; its summary."""
    from headlens.cli.circuit_graph import graph_lines

    summary = f"task {document['task']}: {document['n_edges']} edges"
    if _written(document, summary, out, out_fmt) or out_fmt is not None:
        return summary
    click.echo(json.dumps(document) if fmt == "json" else "\n".join(graph_lines(document)))
    if "backups" in document and fmt != "json":
        _print_backups(document["backups"])
    return summary


def _written(document: dict, summary: str, out: str | None, out_fmt: str | None) -> bool:
    """Write the document to `--out FILE.json` with the summary on stdout; False when --out names no JSON file."""
    if out_fmt != "json":
        return False
    from headlens.files import write_out

    write_out(out, document=document)
    click.echo(f"{summary}; wrote {out}")
    return True


def _signed(value) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _print_document(doc: dict) -> None:
    task = doc["task"]
    click.echo(f"task {task['name']}: {task['description']}")
    click.echo(f"clean {task['metric']}: {task['clean']:.3f} {task['unit']}; its logit part {task['logit_metric']:.3f}")
    heads = doc["heads"]
    click.echo(
        f"\ndirect effects through the logits (top {SHOWN_HEADS} of {len(heads)}; logits; "
        f"total: {doc['method']}-ablated alone)"
    )
    click.echo(f"{'head':>6}  {'direct':>8}  {'total':>8}  labels")
    for row in heads[:SHOWN_HEADS]:
        names = ", ".join(row["labels"]) or "-"
        names += " (no role; large)" if row["large_unlabelled"] else ""
        click.echo(f"{row['head']:>6}  {_signed(row['direct_effect']):>8}  {_signed(row['total_effect']):>8}  {names}")
    rest = sum(doc["rest"].values())
    click.echo(
        f"sum over heads {sum(r['direct_effect'] for r in heads):+.3f} + rest {rest:+.3f} (embeddings, MLPs, biases)"
    )
    large = [r["head"] for r in heads if r["large_unlabelled"]]
    share = f"{doc['large_share']:.0%} of {abs(task['logit_metric']):.2f}"
    click.echo(f"heads with a large direct effect and no role (>= {share}): {', '.join(large) or 'none'}")
    _print_edges(doc)
    repair = doc["self_repair"]
    if repair is not None:
        click.echo(f"\nself-repair: {repair['sentence']}")
        click.echo(f"{'head':>6}  {'clean':>8}  {'ablated':>8}  {'change':>8}")
        for row in repair["compensation"][:SHOWN_COMPENSATION]:
            click.echo(f"{row['head']:>6}  {row['clean']:+8.3f}  {row['ablated']:+8.3f}  {row['change']:+8.3f}")
    if doc.get("backups"):
        _print_backups(doc["backups"])


def _print_backups(found: dict) -> None:
    lost = f"{found['lost']:+.3f} {found['unit']}"
    click.echo(
        f"\nbackups of {found['role']} ({', '.join(found['ablated'])} {found['method']}-ablated, their direct effect "
        f"{lost} lost; p against {found['controls']} random sets of the same per-layer counts, "
        f"floor {found['p_min']:.3f})"
    )
    auc = "-" if found["auc"] is None else f"{found['auc']:.2f}"
    click.echo(f"backups: {', '.join(found['backups']) or 'none'}; OV-similarity detector ROC-AUC against them: {auc}")
    click.echo(f"{'head':>6}  {'clean':>8}  {'ablated':>8}  {'compensation':>12}  {'p':>6}  {'ov_sim':>6}  backup")
    for row in found["heads"][:SHOWN_COMPENSATION]:
        click.echo(
            f"{row['head']:>6}  {row['clean']:+8.3f}  {row['ablated']:+8.3f}  {row['compensation']:+12.3f}  "
            f"{row['p_value']:6.3f}  {row['ov_similarity']:6.2f}  {'yes' if row['backup'] else '-'}"
        )


def _print_edges(doc: dict) -> None:
    edges = doc["edges"]
    shown = f"top {SHOWN_EDGES} of {len(edges)} by |path-patching effect|, on {doc['patched_sequences']} sequences"
    click.echo(f"\nedges ({shown}; {doc['task']['unit']})")
    click.echo(f"{'sender':>6}  {'receiver':>8}  {'via':>6}  {'composition':>11}  {'effect':>8}  {'attribution':>11}")
    for row in edges[:SHOWN_EDGES]:
        comp = "-" if row["composition"] is None else f"{row['composition']:.3f}"
        effect, attribution = _signed(row["effect"]), _signed(row["attribution"])
        click.echo(
            f"{row['sender']:>6}  {row['receiver']:>8}  {row['via']:>6}  {comp:>11}  {effect:>8}  {attribution:>11}"
        )
    if doc["agreement"]:
        click.echo(f"attribution vs path patching: {json.dumps(doc['agreement'])}")


COMMANDS = [circuit_command]
