"""One `headlens circuit` run as one value (`CircuitSpec`) and its one entry point (`run_circuit`).

`CircuitSpec` holds everything the command is asked: the task (a built-in one, IOI prompts or a task
file), what is done with it (the circuit of headlens.circuits.circuit; `discover`, the circuit found on the
whole graph by headlens.circuits.discover; or `graph`, an EAP-IG/MIB graph file's faithfulness), the
heads ablated for the self-repair table, the methods, the labels and whether the task's backups are found.
`CircuitSpec.parse` reads them as the command line spells them (the prompts and labels files read, the
methods and `random:K` checked) before any model is loaded. `run_circuit` then runs it and returns a
Result of kind "circuit" or "circuit_graph"; with backups, the backups Result (headlens.circuits.backups)
rides along in `.tables["backups"]` and `.meta["backups"]` (`backups_of` takes it back out).
`circuit_document` is the command's JSON document of either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from headlens.circuits import backups as backup_docs
from headlens.circuits.attribution import EAP_METHODS
from headlens.circuits.backups import ROLE_OF_TASK, find_backups, role_heads
from headlens.circuits.circuit import circuit, to_document
from headlens.circuits.discover import discover, measure
from headlens.circuits.faithfulness import DEFAULT_METHOD, DEFAULT_STEPS, GraphTask, faithfulness
from headlens.circuits.faithfulness import METHODS as GRAPH_METHODS
from headlens.circuits.graph import graph_of, nodes_in
from headlens.circuits.interchange import read_graph, write_graph
from headlens.circuits.moretasks import circuit_task, variants
from headlens.circuits.selfrepair import METHODS
from headlens.circuits.tasks import make_task
from headlens.classify.roles import model_labels, read_labels, resolve_heads
from headlens.errors import ConfigError
from headlens.intervene.evalset import read_prompts
from headlens.intervene.stats import parse_control
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

Say = Callable[[str], None]  # where a run's notes go (the command line: one line on stderr each)
CURVE_POINTS_FILE = 20  # faithfulness curve points of a graph file's circuit


@dataclass(frozen=True)
class CircuitSpec:
    """What one circuit run is asked (see the module docstring); `parse` builds and checks one."""

    task: str = "induction"  # induction | ioi | greater-than (greater-than with discover or graph)
    task_file: str | None = None  # with discover/graph: a JSONL task (headlens.circuits.moretasks.file_task)
    prompts: list[dict] | None = None  # with task ioi: the prompts (headlens.intervene.evalset.read_prompts)
    discover: bool = False  # find the circuit on the whole graph (headlens.circuits.discover)
    graph: str | None = None  # score the faithfulness of this EAP-IG/MIB graph JSON
    edges: int | None = None  # with discover: keep the top N edges
    target: float | None = None  # with discover: the smallest circuit with this faithfulness [0.8]
    ablation: str = "patching"  # with discover/graph: edges outside carry the counterfactual run or the mean
    graph_out: str | None = None  # with discover/graph: write the circuit as EAP-IG JSON here
    stability: bool = True  # with discover: the resampled circuits
    selection: str = "top"  # with discover: one of headlens.circuits.discover.SELECTIONS
    heads: str | None = None  # the heads (or role) ablated for the self-repair table
    method: str = "zero"  # replacement (zero | mean | resample), or with discover/graph: exact | eap | eap-ig
    approx: str | None = None  # also score the edges by edge attribution (EAP_METHODS)
    steps: int = DEFAULT_STEPS  # integration steps of eap-ig
    labels: dict | None = None  # Head -> labels from a labels file (None: classify the model)
    backups: int | None = None  # K random control sets of the backups search (None: no search)
    backups_if_role: bool = False  # with backups: search only where the task has a role some head carries
    seed: int = 0  # the task's inputs and resampling

    @property
    def on_graph(self) -> bool:
        """Whether the run is on the whole graph (discover, or a graph file's faithfulness)."""
        return self.discover or self.graph is not None

    @classmethod
    def parse(
        cls,
        *,
        method: str | None = None,
        prompts_path=None,
        labels_path=None,
        backups: bool | None = None,
        control: str = "random:39",
        **given,
    ) -> CircuitSpec:
        """A CircuitSpec from the command line's values: `method` None is the mode's default (zero; on the graph
        DEFAULT_METHOD), `backups` None the mode's default (with discover: searched where the task's role has
        heads; otherwise not), `control` "random:K" (checked on the graph only with backups), the prompts and
        labels read from their files. ConfigError or InputTextError for a bad value."""
        on_graph = given.get("discover") or given.get("graph") is not None
        if_role = backups is None and bool(given.get("discover"))
        backups = if_role or bool(backups)
        method = method or (DEFAULT_METHOD if on_graph else "zero")
        check_method(method, given.get("approx"), on_graph)
        controls = parse_control(control) if backups or not on_graph else None  # a malformed K fails before work
        prompts = read_prompts(prompts_path) if prompts_path else None
        labels = read_labels(labels_path) if labels_path else None
        found = controls if backups else None
        return cls(method=method, prompts=prompts, labels=labels, backups=found, backups_if_role=if_role, **given)


def check_method(method: str, approx: str | None, on_graph: bool) -> None:
    """ConfigError for a method (or `approx`) the run cannot take."""
    if on_graph:
        if method not in GRAPH_METHODS:
            raise ConfigError(f"unknown --method {method!r} with --discover: choose one of {', '.join(GRAPH_METHODS)}")
        return
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if approx is not None and approx not in EAP_METHODS:
        raise ConfigError(f"unknown --approx {approx!r}: choose one of {', '.join(EAP_METHODS)}")


def run_circuit(loaded: LoadedModel, spec: CircuitSpec, progress: bool = False, say: Say | None = None) -> Result:
    """Run `spec` on `loaded`: a Result of kind "circuit" (headlens.circuits.circuit.circuit) or, on the whole
    graph, "circuit_graph" (headlens.circuits.discover); with `spec.backups` the backups Result rides along
    (backups_of). A written graph file is said through `say`."""
    say = say or (lambda line: None)
    if spec.on_graph:
        return _on_graph(loaded, spec, say)
    task = make_task(loaded, spec.task, prompts=spec.prompts, seed=spec.seed)
    labels = model_labels(loaded, spec.labels)
    heads = resolve_heads(loaded, spec.heads, labels)[0] if spec.heads else None
    result = circuit(loaded, task, labels, heads, spec.method, spec.approx, spec.steps, spec.seed, progress)
    if spec.backups is None:
        return result
    found = find_backups(loaded, task, labels, method=spec.method, controls=spec.backups, seed=spec.seed)
    return with_backups(result, found)


def _on_graph(loaded: LoadedModel, spec: CircuitSpec, say: Say) -> Result:
    """discover, or a graph file's faithfulness; the graph written and the backups found when asked. The
    backups' role is ablated as the graph's outside is: from the counterfactual run (resample) or by its mean."""
    task = circuit_task(loaded, spec.task, spec.prompts, spec.task_file, spec.seed)
    if spec.graph is not None:
        gt = GraphTask(loaded, task, spec.ablation)
        keep, scores = read_graph(spec.graph, gt.graph)
        points, facts = CURVE_POINTS_FILE, {}
        result = measure(gt, scores, "file", int(keep.sum()), None, points, facts, spec.seed, 0, None, None)
        result.meta.update(file_faithfulness(gt, keep))
    else:
        given = model_labels(loaded, spec.labels)
        labels = {str(h): names for h, names in given.items()}
        pairs = None if spec.task_file or spec.prompts else variants(loaded, task.name, spec.seed)
        result = discover(
            loaded,
            task,
            spec.method,
            spec.edges,
            spec.target,
            spec.ablation,
            spec.steps,
            labels=labels,
            variants=pairs,
            seed=spec.seed,
            with_stability=spec.stability,
            selection=spec.selection,
        )
    if spec.graph_out:
        write_result_graph(spec.graph_out, loaded, result)
        say(f"wrote {spec.graph_out}")
    if spec.backups is None or spec.graph is not None:
        return result
    role = ROLE_OF_TASK.get(task.name)
    if spec.backups_if_role and not (role and role_heads(given, role)):
        why = f"no head is labelled {role}" if role else f"the {task.name} task has no role"
        return Result(result.kind, result.frame, {**result.meta, "backups_not_searched": why}, tables=result.tables)
    method = "resample" if spec.ablation == "patching" else "mean"
    found = find_backups(loaded, task, given, method=method, controls=spec.backups, seed=spec.seed)
    return with_backups(result, found)


def with_backups(result: Result, found: Result) -> Result:
    """`result` with the backups Result `found` riding along: its frame in `.tables["backups"]`, its meta in
    `.meta["backups"]`."""
    meta = {**result.meta, "backups": found.meta}
    return Result(result.kind, result.frame, meta, tables={**result.tables, "backups": found.frame})


def backups_of(result: Result) -> Result | None:
    """The backups Result riding along a run_circuit Result (with_backups), or None."""
    if "backups" not in result.tables:
        return None
    return Result("backups", result.tables["backups"], result.meta["backups"])


def file_faithfulness(gt: GraphTask, keep: torch.Tensor) -> dict:
    """A graph file's circuit as it stands (not re-ranked): its faithfulness and size."""
    full, empty = gt.ends()
    keep = keep & gt.graph.real  # [senders, receivers]
    f = faithfulness(gt.metric(keep), full, empty)
    return {"faithfulness": f, "n_edges": int(keep.sum()), "n_nodes": len(nodes_in(gt.graph, keep)), "method": "file"}


def write_result_graph(path, loaded: LoadedModel, result: Result) -> None:
    """A circuit_graph Result's edges (every edge of the graph, its score, whether it is in the circuit) as
    EAP-IG JSON (headlens.circuits.interchange.write_graph)."""
    graph = graph_of(loaded.adapter)
    edges = result.tables["edges"]
    keep = torch.zeros(graph.real.shape, dtype=torch.bool)  # [senders, receivers]
    scores = torch.zeros(graph.real.shape, dtype=torch.float64)  # [senders, receivers]
    names = [
        (graph.sender_names.index(s), graph.receiver_names.index((r, v)))
        for s, r, v in zip(edges["sender"], edges["receiver"], edges["via"], strict=True)
    ]
    for (s, r), score, inside in zip(names, edges["score"], edges["in_graph"], strict=True):
        keep[s, r], scores[s, r] = bool(inside), float(score)
    write_graph(path, graph, scores, keep, loaded.adapter.d_model)


def circuit_document(result: Result, model: dict) -> dict:
    """The JSON document of `headlens circuit --format json` of a run_circuit Result; `model` describes the model
    (headlens.reports.facts.model_info). A circuit: headlens.circuits.circuit.to_document, with `backups`
    attached (headlens.circuits.backups.attach). On the graph: `model` (its name), the meta, `nodes`, the
    circuit's `edges`, the faithfulness `curve`, and `backups` (headlens.circuits.backups.to_document)."""
    found = backups_of(result)
    if result.kind == "circuit":
        document = to_document(result, model)
        return document if found is None else backup_docs.attach(document, found)
    edges = result.tables["edges"]
    frame = result.frame.astype(object).where(result.frame.notna(), None)
    document = {
        "model": model["name"],
        **{key: value for key, value in result.meta.items() if key != "backups"},
        "nodes": [{**row, "roles": list(row["roles"])} for row in frame.to_dict("records")],
        "edges": edges[edges["in_graph"]].to_dict("records"),
        "curve": result.tables["curve"].to_dict("records"),
    }
    if found is not None:
        document["backups"] = backup_docs.to_document(found)
    return document
