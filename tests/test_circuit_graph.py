"""The whole model's graph (headlens.circuits.graph, graphrun, faithfulness, discover, interchange) against:
1. the model itself: the full circuit's metric is the Hugging Face model's on the clean sequences and the
   empty circuit's on the counterfactual ones, on every family (GQA, MQA, sliding windows, parallel
   residual, Gemma 3's sandwich norms);
2. an independent patching loop written here with plain torch hooks on `tiny` (GPT-2): a circuit that
   lacks every outgoing edge of some nodes is those nodes' outputs patched from the counterfactual run,
   done by hooking c_proj's input (z) and the MLPs' outputs;
3. the EAP-IG graph JSON written and read back unchanged (edge names as hannamw/EAP-IG names them);
4. the construction of the user's task file: a malformed line is named.
"""

from __future__ import annotations

import json

import pytest
import torch

from headlens.circuits.faithfulness import GraphTask, faithfulness
from headlens.circuits.graph import ModelGraph, prune, top_edges
from headlens.circuits.interchange import read_graph, write_graph
from headlens.circuits.moretasks import file_task, greater_than_task
from headlens.circuits.tasks import induction_task
from headlens.errors import InputTextError
from tests.helpers.families import FAMILY_NAMES, build_family

# float32 runs of a few layers; the metric is a mean loss of ~5-10 nats: rounding ~1e-6 relative
ATOL = 1e-5


def _model_metric(loaded, task, ids) -> float:
    with torch.no_grad():
        logits = loaded.model(input_ids=ids, attention_mask=task.mask.long()).logits
    return float(task.metric(logits))


@pytest.fixture(scope="module")
def tiny():
    from headlens.load.models import load_model

    return load_model("tiny")


@pytest.mark.parametrize("name", ["tiny", *FAMILY_NAMES])
def test_full_circuit_is_the_model_and_empty_is_the_counterfactual(name, tiny):
    loaded = tiny if name == "tiny" else build_family(name, seed=3)
    task = induction_task(loaded, n=3, seq_len=6, seed=1)
    gt = GraphTask(loaded, task, batch_tokens=26)  # two batches
    full, empty = gt.ends()
    assert full == pytest.approx(_model_metric(loaded, task, task.tokens), abs=ATOL)
    assert empty == pytest.approx(_model_metric(loaded, task, task.corrupted), abs=ATOL)
    assert abs(full - empty) > 100 * ATOL  # the two ends differ, so the checks above can fail


def _hooked_metric(loaded, task, patched_heads, patched_mlps) -> float:
    """The metric with the outputs of `patched_heads` ((layer, head)) and `patched_mlps` (layers) taken
    from the counterfactual run, by plain forward hooks on the Hugging Face GPT-2 modules."""
    blocks, d_head = loaded.model.transformer.h, loaded.model.config.n_embd // loaded.model.config.n_head
    saved: dict = {}

    def run(ids, mode):
        handles = []
        for layer, block in enumerate(blocks):

            def on_z(module, args, layer=layer):
                key = ("z", layer)
                if mode == "save":
                    saved[key] = args[0].clone()
                    return None
                z = args[0].clone()  # [batch, pos, head * d_head]
                for lay, head in patched_heads:
                    if lay == layer:
                        z[..., head * d_head : (head + 1) * d_head] = saved[key][
                            ..., head * d_head : (head + 1) * d_head
                        ]
                return (z,)

            def on_mlp(module, args, out, layer=layer):
                if mode == "save":
                    saved[("m", layer)] = out.clone()
                    return None
                return saved[("m", layer)] if layer in patched_mlps else None

            handles.append(block.attn.c_proj.register_forward_pre_hook(on_z))
            handles.append(block.mlp.register_forward_hook(on_mlp))
        try:
            with torch.no_grad():
                return loaded.model(input_ids=ids, attention_mask=task.mask.long()).logits
        finally:
            for h in handles:
                h.remove()

    run(task.corrupted, "save")
    return float(task.metric(run(task.tokens, "patch")))


def test_faithfulness_matches_an_independent_hooked_patching_loop(tiny):
    task = induction_task(tiny, n=4, seq_len=8, seed=2)
    gt = GraphTask(tiny, task)
    graph = gt.graph
    heads, mlps = [(0, 1), (1, 3)], [0]
    keep = graph.real.clone()
    for layer, head in heads:
        keep[graph.head_sender(layer, head)] = False
    for layer in mlps:
        keep[graph.mlp_sender(layer)] = False
    full, empty = gt.ends()
    ours = faithfulness(gt.metric(keep), full, empty)
    theirs = faithfulness(_hooked_metric(tiny, task, heads, mlps), full, empty)
    assert ours == pytest.approx(theirs, abs=1e-5)
    assert 0.02 < abs(1 - ours)  # the patched nodes matter: f is not trivially 1


def test_a_circuit_whose_blocks_are_not_all_run_matches_the_hooked_loop(tiny):
    # the input, two heads and MLP 0 send all their edges, into the receivers of those nodes and the
    # logits only: MLP 1 gets no edge, so it is not run; the hooked loop patches every other node
    task = induction_task(tiny, n=4, seq_len=8, seed=3)
    gt = GraphTask(tiny, task)
    graph, config = gt.graph, tiny.model.config
    kept_heads, kept_mlps = [(0, 2), (1, 0)], [0]
    senders = [0, *(graph.head_sender(*h) for h in kept_heads), *(graph.mlp_sender(m) for m in kept_mlps)]
    receivers = [graph.head_receiver(*h, via) for h in kept_heads for via in "qkv"]
    receivers += [graph.mlp_receiver(m) for m in kept_mlps] + [graph.logits_receiver]
    keep = torch.zeros_like(graph.real)
    keep[torch.tensor(senders)[:, None], torch.tensor(receivers)[None, :]] = True
    heads = [(layer, head) for layer in range(config.n_layer) for head in range(config.n_head)]
    patched = [h for h in heads if h not in kept_heads]
    mlps = [m for m in range(config.n_layer) if m not in kept_mlps]
    full, empty = gt.ends()
    runs = []
    handle = tiny.model.transformer.h[1].mlp.register_forward_hook(lambda *args: runs.append(1))
    try:
        ours = faithfulness(gt.metric(keep), full, empty)
    finally:
        handle.remove()
    theirs = faithfulness(_hooked_metric(tiny, task, patched, mlps), full, empty)
    assert runs == []  # MLP 1 was not run
    assert ours == pytest.approx(theirs, abs=1e-5)
    assert 0.02 < abs(ours) and 0.02 < abs(1 - ours)  # neither end: the kept nodes carry part of it


def test_eap_ig_json_round_trips(tmp_path, tiny):
    graph = ModelGraph(2, 4)
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(graph.real.shape, generator=gen, dtype=torch.float64) * graph.real
    keep = prune(graph, top_edges(graph, scores, 12))
    path = tmp_path / "circuit.json"
    write_graph(path, graph, scores, keep, d_model=64)
    doc = json.loads(path.read_text())
    assert set(doc) == {"cfg", "nodes", "edges"} and doc["cfg"]["n_heads"] == 4
    assert len(doc["edges"]) == graph.n_edges == 110
    assert "a0.h1->a1.h3<k>" in doc["edges"] and "m1->logits" in doc["edges"] and "input->m0" in doc["edges"]
    back_keep, back_scores = read_graph(path, graph)
    assert torch.equal(back_keep, keep)
    assert torch.equal(back_scores, scores)


def test_a_circuit_file_of_another_model_or_bad_json_is_refused(tmp_path):
    from headlens.errors import ConfigError

    path = tmp_path / "c.json"
    path.write_text('{"cfg": {"n_layers": 3, "n_heads": 4}, "edges": {}}')
    with pytest.raises(ConfigError, match="3 x 4"):
        read_graph(path, ModelGraph(2, 4))
    path.write_text("{not json")
    with pytest.raises(InputTextError, match="is not valid JSON"):
        read_graph(path, ModelGraph(2, 4))


def test_user_task_file_and_its_malformed_line(tmp_path, tiny):
    good = {"prompt": "ab ab a", "answer": "b", "counterfactual": "cd cd c", "wrong": ["a", "c"]}
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(good) + "\n")
    task = file_task(tiny, path)
    assert task.tokens.shape[0] == 2 and task.terms.kind == "logit"
    assert task.terms.weight.tolist() == [1.0, -0.5, -0.5, 1.0, -0.5, -0.5]
    path.write_text(json.dumps(good) + "\n" + '{"prompt": "x"\n')
    with pytest.raises(InputTextError, match="line 2 is not valid JSON"):
        file_task(tiny, path)
    path.write_text(json.dumps({**good, "counterfactual": "cd cd cd"}) + "\n")
    with pytest.raises(InputTextError, match="line 1: prompt is"):
        file_task(tiny, path)


def test_greater_than_reads_the_last_digit_on_a_digit_tokenizer(tiny):
    task = greater_than_task(tiny, n=4, seed=0)
    assert "last digit" in task.description
    assert torch.equal(task.mask, task.mask) and task.corrupted.shape == task.tokens.shape
    # per prompt: ten digit terms, +1 above the start year's last digit and -1 up to it
    weights = task.terms.weight.view(4, 10)
    assert ((weights == 1).sum(1) + (weights == -1).sum(1)).tolist() == [10] * 4


def _cli(*args):
    from click.testing import CliRunner

    from headlens.cli.main import cli

    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def labels_path(tmp_path_factory, small_config):
    records = [
        {"layer": layer, "head": head, "labels": ["induction"] if layer == 1 else []}
        for layer in range(small_config.n_layer)
        for head in range(small_config.n_head)
    ]
    path = tmp_path_factory.mktemp("labels") / "heads.json"
    path.write_text(json.dumps(records))
    return str(path)


def test_cli_discover_writes_a_graph_that_circuit_reads_back(tmp_path, small_model_dir, labels_path):
    graph_file = str(tmp_path / "g.json")
    args = [
        "circuit",
        str(small_model_dir),
        "--task",
        "induction",
        "--discover",
        "--edges",
        "12",
        "--labels",
        labels_path,
    ]
    found = _cli(*args, "--no-stability", "--format", "json", "--graph-out", graph_file)
    assert found.exit_code == 0, found.output
    doc = json.loads(found.stdout)
    assert doc["ablation"] == "patching" and doc["n_edges"] == len(doc["edges"]) <= 12
    assert (doc["method"], doc["steps"]) == ("eap-ig", 5)  # discovery's default: EAP-IG, 5 steps
    assert all(node["roles"] == ["induction"] for node in doc["nodes"] if node["kind"] == "head" and node["layer"] == 1)
    written = json.loads((tmp_path / "g.json").read_text())
    assert sum(e["in_graph"] for e in written["edges"].values()) == doc["n_edges"]
    again = _cli("circuit", str(small_model_dir), "--task", "induction", "--circuit", graph_file, "--format", "json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["faithfulness"] == pytest.approx(doc["faithfulness"], abs=1e-9)


def test_cli_discover_out_writes_the_document_stdout_would_have_printed(tmp_path, small_model_dir, labels_path):
    args = ["circuit", str(small_model_dir), "--task", "induction", "--discover", "--edges", "12", "--no-stability"]
    args += ["--method", "eap"]  # the document, whatever scored it: the cheaper method
    printed = _cli(*args, "--labels", labels_path, "--format", "json")
    assert printed.exit_code == 0, printed.output
    out = tmp_path / "circuit.json"
    written = _cli(*args, "--labels", labels_path, "--out", str(out))
    assert written.exit_code == 0, written.output
    doc = json.loads(out.read_text())
    assert doc == json.loads(printed.stdout)
    assert written.stdout.strip() == f"task induction: {doc['n_edges']} edges; wrote {out}"


def test_cli_names_the_malformed_line_of_a_task_file(tmp_path, small_model_dir):
    path = tmp_path / "task.jsonl"
    path.write_text('{"prompt": "a b", "answer": " c", "counterfactual": "d e", "wrong": " f"}\n[1, 2]\n')
    got = _cli("circuit", str(small_model_dir), "--task-file", str(path), "--discover")
    assert got.exit_code == 2
    assert "line 2" in got.output and "Traceback" not in got.output


def test_a_permuted_subset_keeps_the_metric_and_stability_is_a_share(tiny):
    from headlens.circuits.discover import stability
    from headlens.circuits.resampled import scored, template_scores
    from headlens.circuits.tasks import take_rows

    task = greater_than_task(tiny, n=4, seed=1)
    order = torch.tensor([2, 0, 3, 1])
    full, empty = GraphTask(tiny, task).ends()
    again = GraphTask(tiny, take_rows(task, order)).ends()
    assert again == pytest.approx((full, empty), abs=1e-6)  # the mean over prompts ignores their order
    small = induction_task(tiny, n=3, seq_len=6, seed=0)
    gt = GraphTask(tiny, small)
    keep = top_edges(gt.graph, gt.scores("eap"), 10)
    pair = [induction_task(tiny, n=3, seq_len=6, seed=s) for s in (5, 6)]
    got = stability(gt, 10, keep, scored(gt, "eap", 1, seed=0)[1], template_scores(tiny, pair, "eap", "patching", 1))
    assert 0.0 <= got["jaccard_resamples"] <= 1.0 and 0.0 <= got["jaccard_templates"] <= 1.0
    assert got["resamples"] == 5 and got["k"] == 10


def test_exact_edge_scores_from_the_clean_run_equal_their_whole_patched_passes(tiny):
    # exact_edges reads an edge into the logits from one clean run and begins any other edge's pass at
    # its receiver's layer from the clean run; the whole graph's patched pass less that edge is the definition
    gt = GraphTask(tiny, induction_task(tiny, n=4, seq_len=8))
    graph = gt.graph
    edges = [(s, graph.logits_receiver) for s in (0, graph.head_sender(0, 1), graph.mlp_sender(graph.n_layers - 1))]
    edges += [(0, graph.head_receiver(1, 0, "k")), (graph.head_sender(0, 0), graph.mlp_receiver(1))]
    edges.append((graph.mlp_sender(0), graph.head_receiver(1, 1, "v")))
    base = gt.metric(graph.real)
    for (s, r), score in zip(edges, gt.exact_edges(edges), strict=True):
        keep = graph.real.clone()
        keep[s, r] = False
        assert score == pytest.approx(gt.metric(keep) - base, abs=1e-5)
    assert any(abs(score) > 1e-3 for score in gt.exact_edges(edges[:3]))  # not all zero by construction
