"""The circuit section's discovered circuit, its faithfulness curve and the backups of a role.

Each block reads JSON-ready data in a circuit document, never the code that made it:
- `discovered` (`discovered_fields` of a discovery Result: its frame's nodes with their roles, its
  `edges` table's edges in the circuit, its `curve` table and the f, CPR and CMD of its meta): the circuit
  drawn left to right by layer (`input`, heads and MLPs, `logits`), heads filled with their role's colour,
  backups outlined dashed; and f against the circuit's size in edges (log axis), with 0.8 and 0.9 marked;
- `backups` (headlens.circuits.backups.to_document): the backups with their compensation, p-value and
  the detector's score, and what was ablated and tested.
Role colours come from the registry (headlens.classify.kinds), the one table the head map reads too;
a backup label is BACKUP_PREFIX + the role it backs up. Every piece of prose comes from the catalogue.
"""

from __future__ import annotations

import networkx as nx
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from headlens.circuits.backups import BACKUP_PREFIX
from headlens.circuits.backups import to_document as backups_document
from headlens.circuits.request import backups_of, circuit_document
from headlens.classify import kinds
from headlens.reports.colours import OTHER, ROLE_COLOURS
from headlens.reports.figures import FIGURE_DPI, figure_uri, plain_text
from headlens.reports.i18n import has, number, t
from headlens.reports.sections import esc, figure, table
from headlens.results import Result

IO_NODE, OUTLINE = "#ffffff", "#333333"
LINES = (0.8, 0.9)  # faithfulness levels drawn on the curve (MIB's smallest circuits reaching them)
SHOWN_BACKUPS = 12


def role_colour(role: str | None) -> str:
    """A node's colour: its role's from the report's one colour table (headlens.reports.colours), OTHER for
    a head with no role."""
    return ROLE_COLOURS.get(role, OTHER) if role else OTHER


def node_roles(labels) -> tuple[str | None, str | None]:
    """(the first role of `labels` in registry order, the role it is a backup of) — None where none."""
    names = [labels] if isinstance(labels, str) else list(labels or [])
    role = next((r for r in kinds.ROLES if r in names), None)
    backup = next((n[len(BACKUP_PREFIX) :] for n in names if n.startswith(BACKUP_PREFIX)), None)
    return role, backup


def discovered_fields(result) -> dict:
    """A discovery Result (frame: one row per node with its roles; tables `edges` and `curve`; meta f (or
    `faithfulness`), CPR, CMD, any case) as a circuit document's `discovered`: `nodes` [{node, roles}],
    `edges` (those in the circuit), `curve` and `f`, `cpr`, `cmd`."""
    frame = result.frame
    name = "node" if "node" in frame else "head"
    roles = "roles" if "roles" in frame else "labels"
    nodes = [{"node": str(r[name]), "roles": list(r[roles]) if roles in frame else []} for _, r in frame.iterrows()]
    edges = result.tables["edges"]
    kept = edges[edges["in_graph"].astype(bool)] if "in_graph" in edges else edges
    meta = {key.lower(): value for key, value in result.meta.items()}
    return {
        "nodes": nodes,
        "edges": [
            {"sender": str(e.sender), "receiver": str(e.receiver), "via": e.via, "score": float(e.score)}
            for e in kept.itertuples()
        ],
        "curve": result.tables["curve"][["edges", "nodes", "faithfulness"]].to_dict("records"),
        "f": meta.get("f", meta.get("faithfulness")),
        "cpr": meta.get("cpr"),
        "cmd": meta.get("cmd"),
    }


def place(node: str) -> tuple[int, int]:
    """(column, order) of a node: `input` first, head "L.H" or "aL.hH" and MLP "mL" in layer L's column (the
    MLP after its layer's heads), `logits` last."""
    if node == "input":
        return (-1, 0)
    if node == "logits":
        return (10**6, 0)
    if node.startswith("m") and node[1:].isdigit():
        return (int(node[1:]), 10**6)
    layer, head = node.replace("a", "").replace("h", "").split(".")
    return (int(layer), int(head))


def shown_name(node: str) -> str:
    """A node as the page writes it: heads "L.H", MLPs "MLP L", `input` and `logits` as they are."""
    if node.startswith("a") and ".h" in node:
        return node[1:].replace(".h", ".")
    return f"MLP {node[1:]}" if node.startswith("m") and node[1:].isdigit() else node


def discovered_graph(disc: dict, backups: set[str] = frozenset()) -> nx.DiGraph:
    """The discovered circuit as a graph in (layer, head) order: node attributes `layer`, `role`, `backup` (the
    role it backs up, from its labels or from `backups`, heads "L.H"), edges with `via` and `score`."""
    graph = nx.DiGraph()
    roles = {n["node"]: node_roles(n["roles"]) for n in disc["nodes"]}
    names = set(roles) | {e["sender"] for e in disc["edges"]} | {e["receiver"] for e in disc["edges"]}
    for node in sorted(names, key=place):
        role, backup = roles.get(node, (None, None))
        if backup is None and shown_name(node) in backups:
            backup = ""  # a backup whose role the drawing does not know
        graph.add_node(node, layer=place(node)[0], role=role, backup=backup)
    for e in sorted(disc["edges"], key=lambda e: (place(e["sender"]), place(e["receiver"]))):
        graph.add_edge(e["sender"], e["receiver"], via=e["via"], score=e["score"])
    return graph


def discovered_graph_uri(disc: dict, lang: str, backups: set[str] = frozenset()) -> str:
    """The discovered circuit as a PNG data URI: heads filled by role, backups outlined dashed, a legend."""
    graph = discovered_graph(disc, backups)
    columns: dict[int, list[str]] = {}
    for node, layer in graph.nodes(data="layer"):
        columns.setdefault(layer, []).append(node)
    pos = nx.multipartite_layout(graph, subset_key=columns)
    fig = Figure(figsize=(9, 5), dpi=FIGURE_DPI)
    ax = fig.add_subplot()
    for dashed in (False, True):
        chosen = [n for n, b in graph.nodes(data="backup") if (b is not None) == dashed]
        if not chosen:
            continue
        fill = [_fill(graph, n) for n in chosen]
        drawn = nx.draw_networkx_nodes(
            graph, pos, nodelist=chosen, ax=ax, node_color=fill, edgecolors=OUTLINE, node_size=700, linewidths=1.5
        )
        if dashed:
            drawn.set_linestyle((0, (3, 2)))
            drawn.set_linewidth(2.5)
    nx.draw_networkx_labels(graph, pos, ax=ax, labels={n: plain_text(shown_name(n)) for n in graph}, font_size=7)
    widths = [0.5 + 2.5 * min(1.0, abs(d["score"])) for _, _, d in graph.edges(data=True)]
    nx.draw_networkx_edges(graph, pos, ax=ax, width=widths, edge_color="#555555", node_size=700, arrows=True)
    ax.legend(handles=_legend(graph, lang), loc="upper left", fontsize=7, frameon=False)
    ax.set_axis_off()
    return figure_uri(fig)


def _fill(graph: nx.DiGraph, node: str) -> str:
    if node in ("input", "logits"):
        return IO_NODE
    data = graph.nodes[node]
    return role_colour(data["role"] or data["backup"])


def role_handles(roles, lang: str) -> list:
    """Legend entries (matplotlib handles) of `roles`, registry order, each in its colour."""
    return [
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            markersize=8,
            markerfacecolor=role_colour(r),
            markeredgecolor=OUTLINE,
            label=plain_text(t(kinds.BY_LABEL[r].name_key, lang)),
        )
        for r in kinds.ROLES
        if r in set(roles)
    ]


def _legend(graph: nx.DiGraph, lang: str) -> list:
    present = {r for _, r in graph.nodes(data="role") if r} | {b for _, b in graph.nodes(data="backup") if b}
    handles = role_handles(present, lang)
    if any(b is not None for _, b in graph.nodes(data="backup")):
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                linestyle="",
                markersize=8,
                markerfacecolor="none",
                markeredgecolor=OUTLINE,
                markeredgewidth=2,
                label=plain_text(t("circuits.legend_backup", lang)),
            )
        )
    return handles


def curve_uri(disc: dict, lang: str) -> str:
    """Faithfulness f against the circuit's size in edges (log axis), 0.8 and 0.9 drawn."""
    curve = pd.DataFrame(disc["curve"])
    fig = Figure(figsize=(5, 3), dpi=FIGURE_DPI)
    ax = fig.add_subplot()
    ax.plot(curve["edges"], curve["faithfulness"], marker="o", color="#333333")
    for level, style in zip(LINES, (":", "--"), strict=True):
        ax.axhline(level, color="#888888", linestyle=style, linewidth=1)
        ax.annotate(number(level, lang), (1.0, level), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    ax.set_xscale("log")
    ax.set_xlabel(t("fig.circuit_edges", lang))
    ax.set_ylabel(t("fig.faithfulness", lang))
    ax.grid(alpha=0.3)
    return figure_uri(fig)


def discovered_block(doc: dict, lang: str) -> str:
    """The discovered circuit's graph, its size and faithfulness, and its curve ("" without one)."""
    disc = doc.get("discovered")
    if not disc:
        return ""
    backups = set((doc.get("backups") or {}).get("backups", []))
    nodes = len({e["sender"] for e in disc["edges"]} | {e["receiver"] for e in disc["edges"]})
    size = t(
        "circuits.discovered_size",
        lang,
        edges=len(disc["edges"]),
        nodes=nodes,
        f=_num(disc["f"], lang),
        cpr=_num(disc["cpr"], lang),
        cmd=_num(disc["cmd"], lang),
    )
    parts = [f"<h4>{esc(t('circuits.discovered_title', lang))}</h4>", f"<p>{esc(size)}</p>"]
    parts.append(
        figure(
            discovered_graph_uri(disc, lang, backups),
            t("circuits.discovered_alt", lang),
            t("circuits.discovered_caption", lang),
        )
    )
    if disc.get("curve"):
        parts.append(figure(curve_uri(disc, lang), t("circuits.curve_alt", lang), t("circuits.curve_caption", lang)))
    return "".join(parts)


def _num(value, lang: str) -> str:
    return "-" if value is None else number(float(value), lang)


def backups_frame(found: dict) -> pd.DataFrame:
    """The backups' rows: head, labels-free figures (compensation, p, detector score), largest first."""
    rows = [
        (h["head"], h["clean"], h["ablated"], h["compensation"], h["p_value"], h["ov_similarity"])
        for h in found["heads"]
        if h["backup"]
    ][:SHOWN_BACKUPS]
    return pd.DataFrame(rows, columns=["head", "clean", "ablated", "compensation", "p_value", "ov_similarity"])


def backups_block(doc: dict, lang: str) -> str:
    """The backups of the task's role: what was ablated and tested, the backups' table, the detector's AUC."""
    found = doc.get("backups")
    if not found:
        return ""
    role = t(kinds.BY_LABEL[found["role"]].name_key, lang) if found["role"] in kinds.BY_LABEL else found["role"]
    intro = t(
        "circuits.backups_intro",
        lang,
        role=role,
        heads=", ".join(found["ablated"]),
        method=found["method"],
        lost=number(found["lost"], lang),
        k=found["controls"],
        p_min=number(found["p_min"], lang),
        alpha=number(found["alpha"], lang),
        share=number(100 * found["min_share"], lang),
    )
    parts = [f"<h4>{esc(t('circuits.backups_title', lang, role=role))}</h4>", f"<p>{esc(intro)}</p>"]
    frame = backups_frame(found)
    parts.append(table(frame, lang=lang) if len(frame) else f"<p>{esc(t('circuits.backups_none', lang))}</p>")
    auc = found.get("auc")
    key = "circuits.backups_auc" if auc is not None else "circuits.backups_auc_none"
    parts.append(f"<p>{esc(t(key, lang, auc='-' if auc is None else number(auc, lang)))}</p>")
    return "".join(parts)


def discovery_document(result, backups: dict | None = None) -> dict:
    """A circuit document of a discovery Result alone (headlens.circuits.discover): `task` (name,
    description, method and its steps, ablation, the whole model's and the empty circuit's metric),
    `discovered` (discovered_fields) and `backups` (headlens.circuits.backups.to_document, or None)."""
    meta = result.meta
    task = {key: meta[key] for key in ("description", "method", "ablation", "metric_full", "metric_empty")}
    task["steps"] = meta.get("steps")  # EAP-IG's integration steps (None for the other methods)
    return {"task": {"name": meta["task"], **task}, "discovered": discovered_fields(result), "backups": backups}


def page_document(item, model_info: dict) -> dict:
    """A circuit as the page reads it: a run_circuit Result (headlens.circuits.request) made into its document,
    a circuit_graph Result into discovery_document, a document (a dict) as it is."""
    if not isinstance(item, Result):
        return item
    if item.kind == "circuit_graph":
        found = backups_of(item)
        return discovery_document(item, None if found is None else backups_document(found))
    return circuit_document(item, model_info)


def task_title(name: str, lang: str) -> str:
    """A task's title: the catalogue's for a built-in task, the name itself for a user's task file."""
    key = f"circuits.task.{name}"
    return t(key, lang) if has(key, lang) else name


def method_words(task: dict, lang: str) -> str:
    """How the edges were scored: the method, with EAP-IG's integration steps."""
    steps = task.get("steps")
    return t("circuits.method_steps", lang, method=task["method"], steps=steps) if steps else task["method"]


def discovery_block(doc: dict, lang: str) -> str:
    """One discovery document's part of the section: the task, how the circuit was found and measured,
    the circuit drawn with its curve, and the backups listed."""
    task = doc["task"]
    how = t(
        "circuits.discovered_how",
        lang,
        description=task["description"],
        method=method_words(task, lang),
        ablation=t(f"circuits.ablation.{task['ablation']}", lang),
        full=number(task["metric_full"], lang),
        empty=number(task["metric_empty"], lang),
    )
    parts = [f"<h3>{esc(task_title(task['name'], lang))}</h3>", f"<p>{esc(how)}</p>"]
    return "".join([*parts, discovered_block(doc, lang), backups_block(doc, lang)])
