"""`headlens circuit --discover` and `--circuit FILE`: a thin shell over headlens.circuits.discover.

`--discover` scores every edge of the model's graph (input, heads with q/k/v inputs, MLPs, logits),
keeps the top N edges (`--edges`) or the smallest set reaching faithfulness F (`--target`, 0.8 by
default), and prints its nodes with their roles, its edges, size, faithfulness, the curve's CPR and
CMD, the sizes at f 0.8 and 0.9, and stability. `--circuit FILE` reads an EAP-IG/MIB graph JSON and
prints its faithfulness. `--format json` prints the same as one document; `--graph-out` writes the
circuit as EAP-IG JSON.
"""

from __future__ import annotations

import json

import click

SHOWN_EDGES = 20


def run_graph_command(model, task_name, task_file, prompts_path, method, labels_path, fmt, placement, options) -> None:
    from headlens.circuits.discover import discover, measure
    from headlens.circuits.faithfulness import METHODS, GraphTask
    from headlens.circuits.interchange import read_graph, write_graph
    from headlens.circuits.moretasks import circuit_task, variants
    from headlens.classify.roles import model_labels, read_labels
    from headlens.errors import ConfigError
    from headlens.intervene.evalset import read_prompts
    from headlens.load.models import load_model

    method = method or "eap"
    if method not in METHODS:
        raise ConfigError(f"unknown --method {method!r} with --discover: choose one of {', '.join(METHODS)}")
    prompts = read_prompts(prompts_path) if prompts_path else None
    given = read_labels(labels_path) if labels_path else None
    loaded = load_model(model, **placement)
    task = circuit_task(loaded, task_name, prompts, task_file, options["seed"])
    if options["circuit_path"]:
        gt = GraphTask(loaded, task, options["ablation"])
        keep, scores = read_graph(options["circuit_path"], gt.graph)
        result = measure(gt, scores, "file", int(keep.sum()), None, 20, {}, options["seed"], 0, False, loaded, None)
        result.meta.update(_file_faithfulness(gt, keep))
    else:
        labels = {str(h): names for h, names in model_labels(loaded, given).items()}
        pairs = None if task_file or prompts else variants(loaded, task.name, options["seed"])
        result = discover(
            loaded,
            task,
            method,
            options["n_edges"],
            options["target"],
            options["ablation"],
            options["steps"],
            labels=labels,
            variants=pairs,
            seed=options["seed"],
            with_stability=options["stability"],
            selection=options.get("selection", "top"),
        )
    if options["graph_out"]:
        from headlens.arch import adapter_for
        from headlens.circuits.graph import graph_of

        adapter = adapter_for(loaded.model)
        edges = result.tables["edges"]
        keep_now, scores_now = _matrices(graph_of(adapter), edges)
        write_graph(options["graph_out"], graph_of(adapter), scores_now, keep_now, adapter.d_model)
        click.echo(f"headlens: wrote {options['graph_out']}", err=True)
    found = None
    if options.get("backups") and not options["circuit_path"]:
        found = _backups(loaded, task, given, options)
    document = to_document(result, str(loaded.name))
    if found is not None:
        document["backups"] = found
    click.echo(json.dumps(document) if fmt == "json" else "\n".join(_lines(document)))
    if found is not None and fmt != "json":
        from headlens.cli.commands_circuit import _print_backups

        _print_backups(found)
    if options.get("report"):
        _write_report(loaded, result, found, options)


def _backups(loaded, task, given, options) -> dict:
    """The backups of the task's role (headlens.circuits.backups), the role's heads ablated as the graph's
    outside is: from the counterfactual run (resample) or by their mean."""
    from headlens.circuits.backups import find_backups
    from headlens.circuits.backups import to_document as backups_document
    from headlens.classify.roles import model_labels

    method = "resample" if options["ablation"] == "patching" else "mean"
    labels = model_labels(loaded, given)
    found = find_backups(loaded, task, labels, method=method, controls=options["backups"], seed=options["seed"])
    return backups_document(found)


def _write_report(loaded, result, found, options) -> None:
    """The HTML report of the discovered circuit: its drawing, faithfulness curve and backups."""
    from headlens.cli.options import model_info
    from headlens.reports import render_report
    from headlens.reports.circuit_figures import discovery_document

    doc = discovery_document(result, found)
    written = render_report(
        options["report"],
        model_info=model_info(loaded),
        circuits=[doc],
        command=options["command"],
        lang=options["lang"],
    )
    click.echo(f"headlens: wrote {written}", err=True)


def _file_faithfulness(gt, keep) -> dict:
    """The file's circuit as it stands (not re-ranked): its faithfulness and size."""
    from headlens.circuits.faithfulness import faithfulness
    from headlens.circuits.graph import nodes_in

    full, empty = gt.ends()
    keep = keep & gt.graph.real
    f = faithfulness(gt.metric(keep), full, empty)
    return {"faithfulness": f, "n_edges": int(keep.sum()), "n_nodes": len(nodes_in(gt.graph, keep)), "method": "file"}


def _matrices(graph, edges):
    import torch

    keep = torch.zeros(graph.real.shape, dtype=torch.bool)
    scores = torch.zeros(graph.real.shape, dtype=torch.float64)
    names = [
        (graph.sender_names.index(s), graph.receiver_names.index((r, v)))
        for s, r, v in zip(edges["sender"], edges["receiver"], edges["via"], strict=True)
    ]
    for (s, r), score, inside in zip(names, edges["score"], edges["in_graph"], strict=True):
        keep[s, r], scores[s, r] = bool(inside), float(score)
    return keep, scores


def to_document(result, model: str) -> dict:
    """The JSON document of a circuit_graph Result: model, meta, nodes, the circuit's edges, curve."""
    edges = result.tables["edges"]
    inside = edges[edges["in_graph"]]
    return {
        "model": model,
        **result.meta,
        "nodes": [
            {**row, "roles": list(row["roles"])}
            for row in result.frame.astype(object).where(result.frame.notna(), None).to_dict("records")
        ],
        "edges": inside.to_dict("records"),
        "curve": result.tables["curve"].to_dict("records"),
    }


def _lines(doc: dict) -> list[str]:
    size = f"{doc['n_edges']} edges, {doc['n_nodes']} nodes (of {doc['graph_edges']} edges)"
    ablation = "counterfactual patching" if doc["ablation"] == "patching" else "mean ablation"
    chosen = f"{doc['method']} ({doc.get('selection', 'top')} edges)"
    lines = [
        f"task {doc['task']}: {doc['description']}",
        f"circuit by {chosen}: {size}; faithfulness {doc['faithfulness']:.3f} ({ablation} outside it)",
        f"metric: whole model {doc['metric_full']:.4f}, empty circuit {doc['metric_empty']:.4f}",
        f"curve over {len(doc['curve'])} sizes: CPR {doc['cpr']:.3f}, CMD {doc['cmd']:.3f}; "
        f"smallest with f >= 0.8: {doc['size_at_0.8']} edges, f >= 0.9: {doc['size_at_0.9']} edges",
    ]
    stab = doc.get("stability")
    if stab:
        templates = "-" if stab["jaccard_templates"] is None else f"{stab['jaccard_templates']:.2f}"
        lines.append(
            f"stability of the top {stab['k']} edges: Jaccard {stab['jaccard_resamples']:.2f} over "
            f"{stab['resamples']} resamples of the prompts, {templates} between two template sets"
        )
    lines.append("\nnodes (roles)")
    for node in doc["nodes"]:
        lines.append(f"  {node['node']:>8}  {', '.join(node['roles']) or '-'}")
    lines.append(f"\nedges (top {SHOWN_EDGES} of {len(doc['edges'])} by |score|)")
    for edge in doc["edges"][:SHOWN_EDGES]:
        lines.append(f"  {edge['sender']:>8} -> {edge['receiver']:<8} {edge['via']:>5}  {edge['score']:+.4f}")
    return lines
