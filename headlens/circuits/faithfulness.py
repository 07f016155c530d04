"""A circuit's metric, the edges' scores, and faithfulness as MIB defines it.

`GraphTask` holds a task cut into batches, each with its reference run (headlens.circuits.graphrun):
- "patching": the task's counterfactual sequences (IOI's ABC run, Greater-than's "...from the year
  1701...", induction's other random tokens), run whole;
- "mean": every sender's output averaged over the task's sequences, per position.
`metric(keep)` is the task's metric when only the edges of `keep` carry the clean run. Faithfulness
(MIB, Mueller et al. 2025): f(C) = (m(C) - m(empty)) / (m(M) - m(empty)), M the whole model.

Edge scores, each the change of the metric when the one edge is patched (m(M minus e) - m(M)):
- "exact": that change, one pass per edge;
- "eap": its first-order estimate (Syed et al. 2023), (reference_s - out_s) . dm/dx_r at the clean run,
  every edge from one forward and one backward pass;
- "eap-ig": the gradient averaged over `steps` runs whose input embeddings go from the reference's to
  the clean ones, alpha = k / steps, k = 1..steps (Hanna et al. 2024, EAP-IG "inputs").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from headlens.arch import adapter_for, get_module
from headlens.circuits.graph import graph_of
from headlens.circuits.graphrun import Record, run_graph
from headlens.circuits.readout import batch_sum, task_terms
from headlens.errors import ConfigError
from headlens.intervene.replace import frozen_weights

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

ABLATIONS = ("patching", "mean")
METHODS = ("exact", "eap", "eap-ig")
# discovery's method when none is named: MIB (Mueller et al. 2025) found EAP-IG the best approximate method, and
# EAP's first-order scores miss a planted circuit that EAP-IG finds (tests/test_circuit_discovery_planted.py)
DEFAULT_METHOD = "eap-ig"
DEFAULT_STEPS = 5  # EAP-IG's integration steps when none are named
BATCH_TOKENS = 192  # positions per batch: the q/k/v inputs of every head of a layer are [3 x head x tokens x d_model]


@dataclass
class Batch:
    rows: slice
    ctx: object
    ref: Record


class GraphTask:
    """A task on a model's graph, with its reference runs (module docstring)."""

    def __init__(self, loaded: LoadedModel, task, ablation: str = "patching", batch_tokens: int = BATCH_TOKENS):
        if ablation not in ABLATIONS:
            raise ConfigError(f"unknown ablation {ablation!r}: choose one of {', '.join(ABLATIONS)}")
        if ablation == "patching" and task.corrupted is None:
            raise ConfigError(f"the {task.name} task has no counterfactual run: use --ablation mean")
        self.loaded, self.model, self.task, self.ablation = loaded, loaded.model, task, ablation
        self.adapter = adapter_for(loaded.model)
        self.graph = graph_of(self.adapter)
        self.terms = task_terms(task)
        self.n_read = int(task.where.sum())
        n, pos = task.tokens.shape
        step = max(1, batch_tokens // pos)
        self.batches = []
        with torch.no_grad():
            for start in range(0, n, step):
                rows = slice(start, min(n, start + step))
                ctx = self.adapter.context(task.tokens[rows], task.mask[rows])
                ref = self._corrupted(rows) if ablation == "patching" else None
                self.batches.append(Batch(rows, ctx, ref))
            if ablation == "mean":
                self._set_means()

    def _corrupted(self, rows: slice) -> Record:
        ctx = self.adapter.context(self.task.corrupted[rows], self.task.mask[rows])
        return run_graph(self.adapter, self.graph, ctx, self.graph.real)[1]

    def _set_means(self) -> None:
        """Each batch's reference: every sender's output and each input averaged over the task's
        sequences at each position (positions a sequence lacks left out)."""
        records = [run_graph(self.adapter, self.graph, b.ctx, self.graph.real)[1] for b in self.batches]
        mask = self.task.mask.to(records[0].outs.dtype)  # [n, pos]
        count = mask.sum(0).clamp(min=1)[:, None]  # [pos, 1]

        def mean(parts):  # parts: [batch, pos, d_model] per batch -> [pos, d_model]
            whole = torch.cat(parts)  # [n, pos, d_model]
            return (whole * mask[..., None]).sum(0) / count

        senders = torch.stack([mean([r.outs[s] for r in records]) for s in range(self.graph.n_senders)])
        attn = [mean([r.attn_in[layer] for r in records]) for layer in range(self.adapter.n_layers)]
        mlp = [mean([r.mlp_in[layer] for r in records]) for layer in range(self.adapter.n_layers)]
        final = mean([r.final for r in records])
        for b in self.batches:
            size = b.rows.stop - b.rows.start
            b.ref = Record(
                senders[:, None].expand(-1, size, -1, -1),
                [a.expand(size, -1, -1) for a in attn],
                [m.expand(size, -1, -1) for m in mlp],
                final.expand(size, -1, -1),
            )

    def metric(self, keep: torch.Tensor) -> float:
        """The task's metric (its mean over read positions) when the edges of `keep` [senders,
        receivers] carry the clean run and every other edge its reference. The whole graph is the
        plain model's pass; a circuit with no edge into the logits is the reference run (no pass)."""
        keep = keep & self.graph.real
        whole = torch.equal(keep, self.graph.real)
        none = not bool(keep[:, self.graph.logits_receiver].any())
        total = 0.0
        with torch.inference_mode():
            for b in self.batches:
                if none:
                    final = b.ref.final  # [batch, pos, d_model]: the logits read the reference alone
                else:
                    ref = None if whole else b.ref
                    final, _ = run_graph(self.adapter, self.graph, b.ctx, keep, ref, record=False)
                total += float(batch_sum(self.adapter, self.terms, self.task.where, b.rows, final))
        return total / self.n_read

    def ends(self) -> tuple[float, float]:
        """m(M) and m(empty): the whole model's metric and the reference run's (computed once)."""
        if getattr(self, "_ends", None) is None:
            self._ends = self.metric(self.graph.real), self.metric(torch.zeros_like(self.graph.real))
        return self._ends

    def scores(self, method: str, steps: int = DEFAULT_STEPS, draws: torch.Tensor | None = None) -> torch.Tensor:
        """Every edge's score [senders, receivers] (0 off the graph's edges) by `method`. With `draws`
        [W, n] (how many times each of the task's n sequences is drawn; eap and eap-ig under patching):
        [W, senders, receivers], each draw's scores, the same as those of the task on its sequences
        (take_rows), from one set of passes: a sequence's outputs, reference and gradients do not
        depend on the sequences beside it, and its metric is a sum over its own read positions."""
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        if draws is not None and (method == "exact" or self.ablation != "patching"):
            raise ConfigError("drawn sequences are scored by eap or eap-ig under patching only")
        if method == "exact":
            return self._exact_scores()
        weights = torch.ones(1, self.task.tokens.shape[0]) if draws is None else draws
        out = self._gradient_scores(1 if method == "eap" else steps, method == "eap-ig", weights.double())
        return out[0] if draws is None else out

    def _exact_scores(self) -> torch.Tensor:
        real = self.graph.real
        out = torch.zeros(real.shape, dtype=torch.float64)
        edges = real.nonzero().tolist()
        for (s, r), score in zip(edges, self.exact_edges(edges), strict=True):
            out[s, r] = score
        return out

    def exact_edges(self, edges):
        """Exact scores of the edges (sender, receiver) given, lazily in order: m(M minus e) - m(M).
        An edge into the logits changes only the logits' input (the clean final residual minus the
        sender's clean output plus its reference output), read from one clean run; any other edge
        takes one patched pass."""
        base, finals = self.ends()[0], None
        for s, r in edges:
            finals = finals if finals is not None else self._clean_runs()
            if r != self.graph.logits_receiver:
                keep = self.graph.real.clone()
                keep[s, r] = False
                yield self._metric_from(keep, self.graph.receiver_layer(r), finals) - base
                continue
            total = 0.0
            with torch.inference_mode():
                for b, clean in zip(self.batches, finals, strict=True):
                    patched = clean.final.clone()  # [batch, pos, d_model]
                    where = self.task.where[b.rows]  # [batch, pos]
                    patched[where] -= clean.outs[s][where] - b.ref.outs[s][where]
                    total += float(batch_sum(self.adapter, self.terms, self.task.where, b.rows, patched))
            yield total / self.n_read - base

    def _clean_runs(self) -> list[Record]:
        """Per batch, the plain model's pass with every sender's output and block input (a Record)."""
        with torch.inference_mode():
            return [run_graph(self.adapter, self.graph, b.ctx, self.graph.real)[1] for b in self.batches]

    def _metric_from(self, keep: torch.Tensor, layer: int, cleans: list[Record]) -> float:
        """`metric(keep)` for a circuit holding every edge into the receivers before `layer`: each pass
        begins at that layer from the clean run (run_graph's `start`)."""
        total = 0.0
        with torch.inference_mode():
            for b, clean in zip(self.batches, cleans, strict=True):
                final, _ = run_graph(self.adapter, self.graph, b.ctx, keep, b.ref, record=False, start=(layer, clean))
                total += float(batch_sum(self.adapter, self.terms, self.task.where, b.rows, final))
        return total / self.n_read

    def _gradient_scores(self, steps: int, interpolate: bool, weights: torch.Tensor) -> torch.Tensor:
        """[W, senders, receivers]: per row of `weights` [W, n], each sequence's scores summed with its
        weight, over the weighted count of read positions."""
        out = torch.zeros((weights.shape[0], *self.graph.real.shape), dtype=torch.float64)
        with frozen_weights(self.model):
            for b in self.batches:
                with torch.no_grad():
                    clean_embed = self.adapter.embed_tokens(b.ctx)  # [batch, pos, d_model]
                grads, clean = None, None
                for k in range(1, steps + 1):
                    alpha = k / steps if interpolate else 1.0
                    # alpha 1 is the clean run itself: its pass also records every sender's clean output
                    embed = None if alpha == 1.0 else b.ref.outs[0] + alpha * (clean_embed - b.ref.outs[0])
                    got, record = self._input_grads(b, embed, with_record=alpha == 1.0)
                    clean = record if alpha == 1.0 else clean
                    if grads is None:
                        grads = got
                    else:
                        for total, part in zip(grads, got, strict=True):
                            total += part
                    del got, record  # the step's gradients are summed: free them before the next pass
                diffs = (b.ref.outs - clean.outs).transpose(0, 1).flatten(2)  # [batch, senders, pos * d_model]
                self._add_scores(out, diffs, [g.div_(steps) for g in grads], weights[:, b.rows])
        reads = weights @ self.task.where.sum(1).double()  # [W]
        return out / reads[:, None, None]

    def _input_grads(self, b: Batch, embed: torch.Tensor | None, with_record: bool = False):
        """dm/dx of every receiver block at one run: per layer the heads' [3 * head, batch, pos,
        d_model] and the MLP's [1, ...], then the logits' [1, ...], in receiver order (and the
        run's Record with every sender's output if `with_record`, else None). `embed` None: the clean
        embeddings."""
        probes: dict = {"attn": [], "attn_x": [], "mlp": [], "final": []}
        with torch.enable_grad():
            final, record = run_graph(
                self.adapter, self.graph, b.ctx, self.graph.real, probes=probes, embed=embed, record=with_record
            )
            value = batch_sum(self.adapter, self.terms, self.task.where, b.rows, final)
            flat = [p for pair in zip(probes["attn"], probes["mlp"], strict=True) for p in pair] + probes["final"]
            grads = list(torch.autograd.grad(value, flat))
        for layer, x in enumerate(probes["attn_x"]):  # the heads' gradients after the norm: before it
            grads[2 * layer] = head_input_grads(self.adapter, layer, x, grads[2 * layer])
        return (grads, record if with_record else None)

    def _add_scores(self, out: torch.Tensor, diffs: torch.Tensor, grads: list[torch.Tensor], weights) -> None:
        """out[w, s, r] += sum over the batch's sequences b of weights[w, b] * diffs[b, s] . grads[r][b] for
        every edge: per receiver block one float32 product per sequence (a sum over pos x d_model terms),
        weighted and added to the float64 totals."""
        graph, receiver = self.graph, 0
        for grad in grads:  # [recv, batch, pos, d_model]
            n_up = graph.upstream(receiver)
            got = torch.bmm(diffs[:, :n_up], grad.flatten(2).permute(1, 2, 0))  # [batch, n_up, recv]
            out[:, :n_up, receiver : receiver + grad.shape[0]] += torch.einsum("wb,bsr->wsr", weights, got.double())
            receiver += grad.shape[0]


def faithfulness(value: float, full: float, empty: float) -> float:
    """MIB's f = (m(C) - m(empty)) / (m(M) - m(empty)); NaN when the whole model and the empty
    circuit score alike."""
    gap = full - empty
    return (value - empty) / gap if gap != 0 else float("nan")


def head_input_grads(adapter, layer: int, x: torch.Tensor, normed_grads: torch.Tensor) -> torch.Tensor:
    """The metric's gradient with respect to each of `layer`'s heads' q, k and v inputs [3 * head,
    batch, pos, d_model], all equal to x [batch, pos, d_model], from its gradient with respect to
    them after the layer's input norm, normed_grads [3, head, batch, pos, d_model]: the norm's
    vector-Jacobian product at x."""
    xs = x.detach().expand(normed_grads.shape).clone().requires_grad_(True)  # [3, head, batch, pos, d_model]
    with torch.enable_grad():
        normed = get_module(adapter.layer(layer), adapter.sites.input_norm)(xs)
        (grads,) = torch.autograd.grad(normed, xs, normed_grads)
    return grads.flatten(0, 1)
