"""What `headlens circuit --discover` and `--circuit FILE` print (headlens.circuits.request runs them).

`--discover` scores every edge of the model's graph (input, heads with q/k/v inputs, MLPs, logits),
keeps the top N edges (`--edges`) or the smallest set reaching faithfulness F (`--target`, 0.8 by
default), and prints its nodes with their roles, its edges, size, faithfulness, the curve's CPR and
CMD, the sizes at f 0.8 and 0.9, and stability. `--circuit FILE` reads an EAP-IG/MIB graph JSON and
prints its faithfulness. `--format json` prints the same as one document; `--graph-out` writes the
circuit as EAP-IG JSON.
"""

from __future__ import annotations

SHOWN_EDGES = 20


def graph_lines(doc: dict) -> list[str]:
    """The table of a circuit found on the whole graph (headlens.circuits.request.circuit_document)."""
    size = f"{doc['n_edges']} edges, {doc['n_nodes']} nodes (of {doc['graph_edges']} edges)"
    ablation = "counterfactual patching" if doc["ablation"] == "patching" else "mean ablation"
    steps = f"{doc['steps']} steps, " if doc.get("steps") else ""
    chosen = f"{doc['method']} ({steps}{doc.get('selection', 'top')} edges)"
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
    if doc.get("backups_not_searched"):
        lines.append(f"backups: not searched ({doc['backups_not_searched']})")
    lines.append("\nnodes (roles)")
    for node in doc["nodes"]:
        lines.append(f"  {node['node']:>8}  {', '.join(node['roles']) or '-'}")
    lines.append(f"\nedges (top {SHOWN_EDGES} of {len(doc['edges'])} by |score|)")
    for edge in doc["edges"][:SHOWN_EDGES]:
        lines.append(f"  {edge['sender']:>8} -> {edge['receiver']:<8} {edge['via']:>5}  {edge['score']:+.4f}")
    return lines
