"""Reducers shared by the score modules: attention mass on a per-query target set."""

from __future__ import annotations

import torch

from headlens.capture import Batch, Reducer


class TargetMassReducer(Reducer):
    """Mean over queries of the attention mass a head puts on that query's target keys.

    `targets_fn(batch) -> [batch, q_pos, k_pos] bool` names the targets; queries that are
    padding, or have no target, or are excluded by `query_fn(batch) -> [batch, q_pos] bool`,
    are not scored. `result()` is [n_layers, n_heads]; `counts` holds the number of scored
    queries (the same for every head).
    """

    wants = frozenset({"pattern"})
    row_blocks = True  # takes patterns in blocks of query rows (capture.Reducer)
    # running sums and counts: added over processes by headlens.distributed.all_reduce_totals
    totals = ("sums", "sq_sums", "counts", "seq_sums", "seq_sq_sums", "n_seqs", "mul_sums", "mul_n")

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        targets_fn,
        query_fn=None,
        layers=None,
        mass_fn=None,
        scored_fn=None,
        n_units: int = 0,
    ):
        self.layers = layers
        self.targets_fn = targets_fn
        # With mass_fn, optional scored_fn(batch) -> [batch, q_pos] bool must equal
        # (targets_fn(batch) & batch.mask[:, None, :]).any(-1): the [batch, q_pos, k_pos] targets
        # are then never built, so memory stays linear in the sequence length.
        self.scored_fn = scored_fn if mass_fn is not None else None
        # Optional fast path: mass_fn(pattern, q_start) -> [batch, head, rows] must equal
        # (pattern * targets[:, q_start:q_start + rows]).sum(-1) (e.g. a diagonal for a fixed
        # offset: no [.., q, k] product).
        self.mass_fn = mass_fn
        self.query_fn = query_fn
        self.sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.sq_sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.counts = torch.zeros(n_layers, dtype=torch.long)  # [layer]
        # Per-sequence statistics: the spread across sequences (evidence) and the "mul" form.
        self.seq_sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.seq_sq_sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.n_seqs = torch.zeros(n_layers, dtype=torch.long)  # [layer] sequences with a scored query
        self.mul_sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.mul_n = torch.zeros(n_layers, dtype=torch.long)  # [layer] sequences seen
        # With n_units (the number of sequences the run will see): each sequence's scored mass and scored
        # queries, the bootstrap's units (headlens.classify.stability), rows by the batch's offset
        self.unit_mass = torch.zeros(n_layers, n_units, n_heads, dtype=torch.float64)  # [layer, unit, head]
        self.unit_n = torch.zeros(n_layers, n_units, dtype=torch.float64)  # [layer, unit]
        if n_units:
            self.totals = (*type(self).totals, "unit_mass", "unit_n")
        self._cache: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self._partial: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> per-sequence sums so far

    def _targets(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is None or self._cache[0] != id(batch):
            if self.scored_fn is not None:
                targets, scored = None, self.scored_fn(batch) & batch.mask  # [batch, q_pos]
            else:
                targets = self.targets_fn(batch) & batch.mask[:, None, :]  # [batch, q_pos, k_pos]
                scored = targets.any(-1) & batch.mask  # [batch, q_pos]
            if self.query_fn is not None:
                scored &= self.query_fn(batch)
            self._cache = (id(batch), targets, scored)
        return self._cache[1], self._cache[2]

    def update(self, layer, batch, pattern=None, z=None, q_start: int = 0):
        targets, scored_all = self._targets(batch)
        rows = slice(q_start, q_start + pattern.shape[-2])
        scored = scored_all[:, rows].to(pattern.device)  # [batch, rows]
        if self.mass_fn is not None:
            raw = self.mass_fn(pattern, q_start).double()  # [batch, head, rows]
        else:
            on_target = pattern * targets[:, None, rows].to(pattern.device)  # [batch, head, rows, k_pos]
            raw = on_target.sum(-1, dtype=torch.float64)  # [batch, head, rows]
        mass = raw * scored[:, None]  # [batch, head, rows]: padding and target-less queries -> 0
        self.add_total("sums", layer, mass.sum((0, 2)))  # on the device until the batch ends
        self.add_total("sq_sums", layer, (mass**2).sum((0, 2)))
        self.add_total("counts", layer, scored.sum())
        real = batch.mask[:, rows].to(pattern.device)  # [batch, rows]
        part = (mass.sum(-1), (raw * real[:, None]).sum(-1))  # [batch, head] each: scored mass, all real mass
        if q_start > 0:
            part = tuple(a + b for a, b in zip(self._partial.pop(layer), part, strict=True))
        if rows.stop < pattern.shape[-1]:  # more blocks of this layer to come
            self._partial[layer] = part
            return
        self._fold_sequences(layer, batch, scored_all, *part)

    def _fold_sequences(self, layer, batch, scored_all, scored_mass, real_mass) -> None:
        """Per-sequence statistics once every query row of the layer has been seen."""
        n_scored = scored_all.sum(-1).to(scored_mass.device)  # [batch]
        if self.unit_n.shape[1]:
            rows = (layer, slice(batch.offset, batch.offset + len(n_scored)))
            self.add_total("unit_mass", rows, scored_mass)
            self.add_total("unit_n", rows, n_scored.double())
        has = n_scored > 0
        seq_mean = scored_mass / n_scored.clamp(min=1)[:, None]  # [batch, head]: mean over scored queries
        kept = seq_mean * has[:, None]  # [batch, head]: sequences with no scored query add 0
        self.add_total("seq_sums", layer, kept.sum(0))
        self.add_total("seq_sq_sums", layer, (kept**2).sum(0))
        self.add_total("n_seqs", layer, has.sum())
        # "mul" form (TransformerLens detect_head): target mass summed over every real query,
        # divided by the pattern's total mass (= the number of real queries), per sequence
        n_real = batch.mask.sum(-1).to(real_mass.device)  # [batch]
        self.add_total("mul_sums", layer, (real_mass / n_real.clamp(min=1)[:, None]).sum(0))
        self.mul_n[layer] += batch.mask.shape[0]

    def result(self) -> torch.Tensor:
        """Mean target mass, [n_layers, n_heads] (NaN where nothing was scored)."""
        self.flush()
        return (
            (self.sums / self.counts[:, None].clamp(min=1))
            .where(self.counts[:, None] > 0, torch.tensor(float("nan")))
            .float()
        )

    def std(self) -> torch.Tensor:
        """Spread across scored queries, [n_layers, n_heads]."""
        self.flush()
        n = self.counts[:, None].clamp(min=1)
        mean = self.sums / n
        return (self.sq_sums / n - mean**2).clamp(min=0).sqrt().float()

    def seq_std(self) -> torch.Tensor:
        """Spread of the per-sequence score across sequences, [n_layers, n_heads] (0 with one sequence)."""
        self.flush()
        n = self.n_seqs[:, None].clamp(min=1)
        mean = self.seq_sums / n
        return (self.seq_sq_sums / n - mean**2).clamp(min=0).sqrt().float()

    def mul_score(self) -> torch.Tensor:
        """TransformerLens `detect_head` "mul" form, [n_layers, n_heads]: per sequence
        sum(A * P) / sum(A) over all real queries (rows sum to 1, so / n_queries), then the mean
        over sequences, as detect_head averages a list of prompts."""
        self.flush()
        return (self.mul_sums / self.mul_n[:, None].clamp(min=1)).float()
