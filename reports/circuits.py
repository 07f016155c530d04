"""The report's "How the heads work together" section, from `headlens circuit` documents
(headlens.circuits.circuit.to_document, one per task).

For each task: a graph drawn with networkx on a matplotlib Agg canvas (no pyplot) — induction: the
strongest measured edges into the induction heads (previous-token -> induction via K, ...) and each
chosen head's direct path to the logits; IOI (where the model does the task, a positive clean logit
difference): the heads of largest direct effect into the logits, and dashed "backup" edges from an ablated
set to the heads that make up for it (self-repair). Beside it: each labelled receiver's evidence ("fed by
16.0 via K (composition 0.12, path patching +0.90 nats)"), the heads with a large direct effect and no
label (listed as such: no kind is given to them), the direct-effect table and the self-repair sentence; then,
where the document carries them, the role's backups (`backups`, `headlens circuit --backups`) and the
discovered circuit with its faithfulness curve (`discovered`), drawn by headlens.reports.circuit_figures.
Heads are filled with their role's colour from the registry (headlens.classify.kinds, the head map's table), a
backup (label `backup_<role>`) outlined dashed. Every piece of prose comes from the catalogue (both languages).
"""

from __future__ import annotations

import sys

import networkx as nx
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headlens.reports.circuit_figures import (
    backups_block,
    discovered_block,
    discovery_block,
    node_roles,
    role_handles,
    task_title,
)
from headlens.reports.colours import LOGITS as LOGITS_COLOUR
from headlens.reports.colours import OTHER, UNLABELLED, role_colour
from headlens.reports.figures import figure_uri, plain_text
from headlens.reports.graph_labels import edge_table, place_edge_labels
from headlens.reports.i18n import DEFAULT_LANG, quantity, t
from headlens.reports.sections import details, esc, figure, fold, section, table

RECEIVER_ROLES = {"induction": ("induction",), "ioi": ("name_mover", "negative_name_mover", "copy_suppression")}
GRAPH_HEADS = 8  # heads drawn into the logits, by |direct effect|
GRAPH_EDGES = 8  # head -> head edges drawn, by |path-patching effect|
CITED = 3  # incoming edges cited per receiver
TABLE_HEADS = 12
NODE_SIZE = 900  # a graph node's area in points²
# The roles a graph colours, in the order a head with several takes its colour (headlens.reports.colours)
COLOURS = {role: role_colour(role) for role in ("induction", "previous_token", "name_mover", "negative_name_mover")}


def circuit_section(documents: list[dict], lang: str = DEFAULT_LANG, folded: bool = False) -> str:
    """The section for one or more circuit documents (one per task); "" when there is none. Documents
    whose edges carry no measured effect (headlens.circuits.overview: composition from the weights only)
    get the weights' introduction, and their edges are drawn and cited by composition. `folded`: all of it
    in one closed <details> naming the tasks (a large model's report, so the page opens short)."""
    if not documents:
        return ""
    measured = [doc for doc in documents if "heads" in doc]  # the others: a discovered circuit alone
    weights_only = bool(measured) and all(_weights_only(doc) for doc in measured)
    intro = "circuits.intro_weights" if weights_only else "circuits.intro" if measured else "circuits.intro_discovered"
    body = [f"<p>{esc(t(intro, lang))}</p>"]
    for doc in documents:
        body.append(task_block(doc, lang) if "heads" in doc else discovery_block(doc, lang))
    tasks = ", ".join(task_title(doc["task"]["name"], lang) for doc in documents)
    opened = fold(t("circuits.open", lang, tasks=tasks), "".join(body), folded)
    return section("circuits", t("circuits.title", lang), opened)


def task_block(doc: dict, lang: str) -> str:
    """One task's graph, evidence, unlabelled heads, direct effects and self-repair."""
    task = doc["task"]
    name = task["name"]
    parts = [f"<h3>{esc(t(f'circuits.task.{name}', lang))}</h3>"]
    clean = t("circuits.clean", lang, metric=task["metric"], value=quantity(task["clean"], lang), unit=task["unit"])
    parts.append(f"<p>{esc(clean)}</p>")
    if name == "ioi" and task["clean"] <= 0:
        parts.append(f"<p>{esc(t('circuits.no_ioi', lang))}</p>")
        return "".join(parts)
    parts.append(figure(graph_uri(doc, lang), t(f"circuits.graph_alt.{name}", lang), t("circuits.graph_caption", lang)))
    evidence = [f"<li>{esc(line)}</li>" for line in evidence_lines(doc, lang)]
    if evidence:
        parts.append(f"<ul>{''.join(evidence)}</ul>")
    large = [h["head"] for h in doc["heads"] if h["large_unlabelled"]]
    share = quantity(doc["large_share"] * abs(task["logit_metric"]), lang)
    key = "circuits.unlabelled" if large else "circuits.unlabelled_none"
    parts.append(f"<p>{esc(t(key, lang, heads=', '.join(large), share=share))}</p>")
    parts.append(table(direct_table(doc), lang=lang))
    edges = edge_table(circuit_graph(doc), lang)
    parts.append(details(t("circuits.edges_open", lang, n=len(edges)), table(edges, lang=lang)))
    repair = doc.get("self_repair")
    if repair:
        parts.append(f"<p>{esc(repair_text(repair, lang))}</p>")
    parts.append(backups_block(doc, lang))
    parts.append(discovered_block(doc, lang))
    return "".join(parts)


def direct_table(doc: dict) -> pd.DataFrame:
    """The heads of largest |direct effect|: head, labels, direct and total effect."""
    rows = [
        (h["head"], ", ".join(h["labels"]), h["direct_effect"], h["total_effect"]) for h in doc["heads"][:TABLE_HEADS]
    ]
    frame = pd.DataFrame(rows, columns=["head", "labels", "direct_effect", "total_effect"])
    return frame.drop(columns="total_effect") if frame["total_effect"].isna().all() else frame  # measured or not shown


def evidence_lines(doc: dict, lang: str) -> list[str]:
    """Per labelled receiver of the task's roles: the measured edges feeding it, strongest first."""
    return [line for _, line in role_evidence(doc, lang)]


def role_lines(documents: list[dict] | None, role: str, lang: str) -> list[str]:
    """The circuit evidence ("fed by ...") of every receiver holding `role`, from all the documents: what
    the findings cite under the role."""
    return [line for doc in documents or [] for found, line in role_evidence(doc, lang) if found == role]


def role_evidence(doc: dict, lang: str) -> list[tuple[str, str]]:
    """(role, line) per labelled receiver of the task's roles: the edges feeding it, strongest first (by
    path-patching effect, or by composition z-score when only the weights were read)."""
    roles = RECEIVER_ROLES[doc["task"]["name"]]
    edges = pd.DataFrame(doc["edges"])
    unit = doc["task"]["unit"]
    strength = "composition_z" if _weights_only(doc) else "effect"
    lines = []
    for head in doc["heads"]:
        role = next((r for r in head["labels"] if r in roles), None)
        if role is None:
            continue
        into = edges[(edges["receiver"] == head["head"]) & edges[strength].notna()] if len(edges) else edges
        into = into.reindex(into[strength].abs().sort_values(ascending=False).index).head(CITED)
        who = t(f"role.{role}", lang)
        direct = quantity(head["direct_effect"], lang)
        if into.empty:
            lines.append((role, t("circuits.fed_none", lang, head=head["head"], role=who, direct=direct)))
            continue
        sources = "; ".join(_source(r, unit, lang) for r in into.itertuples())
        lines.append((role, t("circuits.fed_by", lang, head=head["head"], role=who, sources=sources, direct=direct)))
    return lines


def _source(edge, unit: str, lang: str) -> str:
    composition = (
        "-" if edge.composition is None or edge.composition != edge.composition else quantity(edge.composition, lang)
    )
    if edge.effect is None or edge.effect != edge.effect:  # composition only (headlens.circuits.overview)
        z = getattr(edge, "composition_z", None)
        z_text = "-" if z is None or z != z else quantity(z, lang)
        via = edge.via.upper()
        return t("circuits.source_weights", lang, sender=edge.sender, via=via, composition=composition, z=z_text)
    return t(
        "circuits.source",
        lang,
        sender=edge.sender,
        via=edge.via.upper(),
        composition=composition,
        effect=f"{'+' if edge.effect >= 0 else ''}{quantity(edge.effect, lang)}",
        unit=unit,
    )


def repair_text(repair: dict, lang: str) -> str:
    """The self-repair claim in words, with its figures."""
    lost = repair["direct_effect"] - repair["direct_effect_ablated"]
    helpers = [c for c in repair["compensation"] if c["change"] * (1 if lost >= 0 else -1) > 0][:2]
    named = ", ".join(f"{c['head']} ({'+' if c['change'] >= 0 else ''}{quantity(c['change'], lang)})" for c in helpers)
    return t(
        "circuits.self_repair",
        lang,
        heads=", ".join(repair["ablated"]),
        direct=quantity(repair["direct_effect"], lang),
        method=repair["method"],
        total=quantity(repair["total_effect"], lang),
        unit=repair["unit"],
        helpers=named or "-",
    )


def circuit_graph(doc: dict) -> nx.DiGraph:
    """The graph drawn for one task: head nodes (layer, role), a `logits` node, measured edges with weights."""
    graph = nx.DiGraph()
    n_layers = max(int(h["head"].split(".")[0]) for h in doc["heads"]) + 1
    info = {h["head"]: h for h in doc["heads"]}

    def add(head: str) -> None:
        h = info[head]
        graph.add_node(head, layer=int(head.split(".")[0]), role=_role(h), backup=node_roles(h["labels"])[1])

    graph.add_node("logits", layer=n_layers, role="logits", backup=None)
    for h in doc["heads"][:GRAPH_HEADS]:
        add(h["head"])
        graph.add_edge(h["head"], "logits", weight=h["direct_effect"], kind="direct")
    strength = "composition" if _weights_only(doc) else "effect"
    edges = [e for e in doc["edges"] if e["via"] != "direct" and e[strength] is not None]
    order = "composition_z" if strength == "composition" else "effect"
    for e in sorted(edges, key=lambda e: -abs(e[order]))[:GRAPH_EDGES]:
        if graph.has_edge(e["sender"], e["receiver"]):
            continue  # one arrow per pair: its strongest input
        add(e["sender"])
        add(e["receiver"])
        graph.add_edge(e["sender"], e["receiver"], weight=e[strength], kind=e["via"])
    repair = doc.get("self_repair")
    if repair:
        lost = repair["direct_effect"] - repair["direct_effect_ablated"]
        helpers = [c for c in repair["compensation"] if c["change"] * (1 if lost >= 0 else -1) > 0][:2]
        for source in repair["ablated"]:
            add(source)
            for c in helpers:
                add(c["head"])
                graph.add_edge(source, c["head"], weight=c["change"], kind="backup")
    return _in_head_order(graph)


def _in_head_order(graph: nx.DiGraph) -> nx.DiGraph:
    """The same graph with its nodes and edges in (layer, head) order, `logits` last. layout() stacks a
    layer's nodes in the graph's node order and edges are drawn in edge order, so the picture depends on
    which heads and edges are drawn, not on the order the document lists them in."""
    ordered = nx.DiGraph()
    ordered.add_nodes_from(sorted(graph.nodes(data=True), key=lambda item: _place(item[0])))
    ordered.add_edges_from(sorted(graph.edges(data=True), key=lambda edge: (_place(edge[0]), _place(edge[1]))))
    return ordered


def _place(node: str) -> tuple[int, int]:
    """(layer, head) of a head node "L.H"; the logits node after every layer."""
    if node == "logits":
        return (sys.maxsize, 0)
    layer, head = node.split(".")
    return (int(layer), int(head))


def _weights_only(doc: dict) -> bool:
    """True when no edge of the document has a measured effect (composition from the weights only)."""
    return all(e.get("effect") is None for e in doc["edges"] if e["via"] != "direct")


def _role(head: dict) -> str:
    """The head's first role in registry order, else "unlabelled" (large direct effect) or "other"."""
    role = node_roles(head["labels"])[0]
    if role is not None:
        return role
    return "unlabelled" if head["large_unlabelled"] else "other"


def _colour(graph: nx.DiGraph, node: str) -> str:
    role = graph.nodes[node]["role"]
    if node == "logits":
        return LOGITS_COLOUR
    return UNLABELLED if role == "unlabelled" else OTHER if role == "other" else role_colour(role)


def graph_uri(doc: dict, lang: str) -> str:
    """The task's graph as a PNG data URI."""
    return figure_uri(graph_figure(doc, lang))


def graph_figure(doc: dict, lang: str) -> Figure:
    """The task's graph (networkx layout by layer, drawn on an Agg canvas), its edges labelled by
    reports/graph_labels.py."""
    graph = circuit_graph(doc)
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    pos = layout(graph)
    for dashed in (False, True):  # a backup (its labels) outlined dashed
        chosen = [n for n, b in graph.nodes(data="backup") if (b is not None) == dashed]
        if chosen:
            drawn = nx.draw_networkx_nodes(
                graph,
                pos,
                nodelist=chosen,
                ax=ax,
                node_color=[_colour(graph, n) for n in chosen],
                edgecolors="#333333",
                node_size=NODE_SIZE,
            )
            drawn.set_linestyle((0, (3, 2)) if dashed else "solid")
    roles = [r for _, r in graph.nodes(data="role") if r not in ("logits", "unlabelled", "other")]
    if roles:
        ax.legend(handles=role_handles(roles, lang), loc="upper left", fontsize=7, frameon=False)
    nx.draw_networkx_labels(graph, pos, ax=ax, labels={n: plain_text(n) for n in graph}, font_size=8)
    for kind, style in (("direct", "solid"), ("q", "solid"), ("k", "solid"), ("v", "solid"), ("backup", "dashed")):
        chosen = [(a, b) for a, b, d in graph.edges(data=True) if d["kind"] == kind]
        if not chosen:
            continue
        widths = [0.5 + 3 * min(1.0, abs(graph.edges[e]["weight"])) for e in chosen]
        colour = ["#2a7f2a" if graph.edges[e]["weight"] >= 0 else "#b22222" for e in chosen]
        nx.draw_networkx_edges(
            graph,
            pos,
            ax=ax,
            edgelist=chosen,
            width=widths,
            edge_color=colour,
            style=style,
            node_size=NODE_SIZE,
            arrows=True,
        )
    ax.set_axis_off()
    fig.tight_layout()
    place_edge_labels(ax, graph, pos, lang, NODE_SIZE)
    return fig


def layout(graph: nx.DiGraph) -> dict:
    """Node -> (x, y): one column per layer, a layer's heads stacked in the graph's node order (head
    order: circuit_graph). The columns are handed to networkx as lists: given the attribute name, it
    groups nodes into sets, whose order follows the process's string hashing and so changes from run
    to run."""
    columns: dict[int, list[str]] = {}
    for node, layer in graph.nodes(data="layer"):
        columns.setdefault(layer, []).append(node)
    return nx.multipartite_layout(graph, subset_key=columns)
