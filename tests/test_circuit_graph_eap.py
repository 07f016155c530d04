"""EAP's and EAP-IG's edge scores on the whole graph (headlens.circuits.faithfulness.GraphTask.scores) against
derivatives taken here without headlens's engine (EAP-IG's: the same derivative averaged over its path).

An edge's EAP score is the metric's derivative along the edge: d/de m(x_r + e (reference_s - out_s)) at
e = 0, where x_r is what receiver r reads (one head's query, key or value input, an MLP's input, the
logits' input) and the sender's output moves towards the counterfactual run's on that edge alone. Here
that derivative is a central finite difference, in float64, of `tiny` (GPT-2) run by Hugging Face with
plain forward hooks: the sender's outputs of both runs caught at c_proj's input (z) or the embeddings,
and the one receiver's input moved (head h's slice of c_attn's output recomputed from ln_1 of the moved
residual; ln_2's or ln_f's input shifted).
"""

from __future__ import annotations

import pytest
import torch

from headlens.circuits.faithfulness import GraphTask
from headlens.circuits.tasks import induction_task

EPS = 1e-4
# the graph's readout takes the log-softmax of float32 logits (~6e-8 relative on scores of order 1); the
# difference's truncation (~EPS^2 x the third derivative) and float64 rounding (~1e-12) are far smaller
ATOL = 1e-7


@pytest.fixture(scope="module")
def tiny64():
    from headlens.load.models import load_model

    loaded = load_model("tiny")
    loaded.model.double()
    return loaded


def _run(loaded, task, ids, embed=None) -> dict:
    """The residual entering each block ("resid" [layer]), z at c_proj's input ("z" [layer]) and the
    embeddings ("embed") of one run of `ids` [n, pos]; `embed` replaces the embeddings (wte + wpe)."""
    model = loaded.model
    seen: dict = {"resid": {}, "z": {}}

    def keep(kind, layer):
        def hook(module, args, kwargs=None):
            seen[kind][layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = []
    for layer, block in enumerate(model.transformer.h):
        handles.append(block.register_forward_pre_hook(keep("resid", layer), with_kwargs=True))
        handles.append(block.attn.c_proj.register_forward_pre_hook(keep("z", layer)))
    if embed is not None:
        handles.append(_embedded(model, embed))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=task.mask.long())
            positions = torch.arange(ids.shape[1])
            seen["embed"] = model.transformer.wte(ids) + model.transformer.wpe(positions)[None]
    finally:
        for h in handles:
            h.remove()
    return seen


def _runs(loaded, task) -> dict:
    """The clean run's and the counterfactual run's _run: {"clean", "ref"}."""
    return {"clean": _run(loaded, task, task.tokens), "ref": _run(loaded, task, task.corrupted)}


def _sender_diff(loaded, runs, sender) -> torch.Tensor:
    """reference_s - out_s [n, pos, d_model] of sender "input" or (layer, head)."""
    if sender == "input":
        return runs["ref"]["embed"] - runs["clean"]["embed"]
    layer, head = sender
    d_head = loaded.model.config.n_embd // loaded.model.config.n_head
    cols = slice(head * d_head, (head + 1) * d_head)
    w_o = loaded.model.transformer.h[layer].attn.c_proj.weight[cols]  # [d_head, d_model] (Conv1D: [in, out])
    return (runs["ref"]["z"][layer][..., cols] - runs["clean"]["z"][layer][..., cols]) @ w_o


def _embedded(model, embed: torch.Tensor):
    """A hook handle: the model's embeddings (wte + wpe, at the embedding dropout) replaced by `embed`."""
    return model.transformer.drop.register_forward_hook(lambda module, args, out: embed)


def _moved_metric(loaded, task, runs, receiver, shift: torch.Tensor, embed=None) -> float:
    """The metric when only `receiver` reads its input plus `shift`: ("q"|"k"|"v", layer, head),
    ("mlp", layer) or ("logits",); the run is runs["clean"]'s, its embeddings `embed` if given (then
    runs["clean"] must be that run's _run)."""
    model = loaded.model
    d_model = model.config.n_embd
    d_head = d_model // model.config.n_head
    if receiver[0] in "qkv":
        via, layer, head = receiver
        block = model.transformer.h[layer]
        start = "qkv".index(via) * d_model + head * d_head  # head h's columns of c_attn's q, k or v part
        cols = slice(start, start + d_head)

        def on_qkv(module, args, out):  # Conv1D: x @ weight + bias
            moved = block.ln_1(runs["clean"]["resid"][layer] + shift) @ module.weight[:, cols] + module.bias[cols]
            out = out.clone()
            out[..., cols] = moved
            return out

        handle = block.attn.c_attn.register_forward_hook(on_qkv)
    else:
        norm = model.transformer.h[receiver[1]].ln_2 if receiver[0] == "mlp" else model.transformer.ln_f
        handle = norm.register_forward_pre_hook(lambda m, a: (a[0] + shift,))
    handles = [handle] if embed is None else [handle, _embedded(model, embed)]
    try:
        with torch.no_grad():
            logits = model(input_ids=task.tokens, attention_mask=task.mask.long()).logits
    finally:
        for h in handles:
            h.remove()
    return _loss(task, logits)


def _loss(task, logits: torch.Tensor) -> float:
    """The induction task's metric, the mean loss at its read positions, in float64 (Task.metric rounds
    the logits to float32, too coarse for a finite difference)."""
    assert task.metric_name == "loss"
    read = logits[task.where]  # [n_read, d_vocab]
    return float(-torch.log_softmax(read, -1)[torch.arange(len(read)), task.target[task.where]].mean())


EDGES = [
    ("input", ("q", 1, 2)),
    ("input", ("k", 1, 2)),
    ("input", ("v", 0, 3)),
    ((0, 1), ("q", 1, 0)),
    ((0, 1), ("k", 1, 3)),
    ((0, 1), ("v", 1, 1)),
    ("input", ("mlp", 0)),
    ((0, 2), ("mlp", 1)),
    ((1, 3), ("logits",)),
]


def _index(graph, sender, receiver) -> tuple[int, int]:
    s = 0 if sender == "input" else graph.head_sender(*sender)
    if receiver[0] in "qkv":
        return s, graph.head_receiver(receiver[1], receiver[2], receiver[0])
    return s, graph.mlp_receiver(receiver[1]) if receiver[0] == "mlp" else graph.logits_receiver


def test_eap_scores_are_the_metric_derivative_along_each_edge(tiny64):
    task = induction_task(tiny64, n=3, seq_len=6, seed=4)
    gt = GraphTask(tiny64, task, batch_tokens=26)  # two batches
    scores = gt.scores("eap")
    runs = _runs(tiny64, task)
    graph = gt.graph
    for sender, receiver in EDGES:
        s, r = _index(graph, sender, receiver)
        diff = _sender_diff(tiny64, runs, sender)
        up = _moved_metric(tiny64, task, runs, receiver, EPS * diff)
        down = _moved_metric(tiny64, task, runs, receiver, -EPS * diff)
        derivative = (up - down) / (2 * EPS)
        assert float(scores[s, r]) == pytest.approx(derivative, abs=ATOL), (sender, receiver)
    assert float(scores.abs().max()) > 1e3 * ATOL  # the scores are not all ~0, so the checks can fail


def test_eap_ig_scores_average_the_derivative_over_the_embedding_path(tiny64):
    """EAP-IG "inputs" (Hanna et al. 2024): the same edge derivative, with the clean run's sender
    difference (reference_s - out_s), taken in the runs whose embeddings are reference + k/n (clean -
    reference), k = 1..n, and averaged: the right Riemann sum. hannamw/EAP-IG's current code takes
    k = 0..n-1 (the left sum); the test checks the two differ on these edges, so it tells them apart."""
    task = induction_task(tiny64, n=3, seq_len=6, seed=4)
    gt = GraphTask(tiny64, task, batch_tokens=26)
    steps = 3
    scores = gt.scores("eap-ig", steps)
    runs = _runs(tiny64, task)
    ref_embed, clean_embed = runs["ref"]["embed"], runs["clean"]["embed"]
    embeds = [ref_embed + (k / steps) * (clean_embed - ref_embed) for k in range(steps + 1)]
    path = [{"clean": _run(tiny64, task, task.tokens, embed)} for embed in embeds]  # each point's run
    for sender, receiver in EDGES:
        diff = _sender_diff(tiny64, runs, sender)
        derivatives = []
        for embed, at in zip(embeds, path, strict=True):
            up = _moved_metric(tiny64, task, at, receiver, EPS * diff, embed)
            down = _moved_metric(tiny64, task, at, receiver, -EPS * diff, embed)
            derivatives.append((up - down) / (2 * EPS))
        right, left = sum(derivatives[1:]) / steps, sum(derivatives[:-1]) / steps
        got = float(scores[_index(gt.graph, sender, receiver)])
        # float32 readout rounding (~6e-8 relative) on each step's gradient: rel 1e-6 is far above it and
        # far below the right and left sums' difference
        assert got == pytest.approx(right, rel=1e-6, abs=ATOL), (sender, receiver)
        assert abs(right - left) > 100 * ATOL, (sender, receiver)
