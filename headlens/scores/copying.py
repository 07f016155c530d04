"""Copying: does a head's output raise the logit of the token it attends to?

Olsson et al. 2022 (arXiv 2209.11895) call a head *copying* when its direct-path effect on the
logits (head output -> W_O -> unembedding, mean logit subtracted) favours the attended token;
the OV-circuit view (positive eigenvalues of W_U W_OV W_E; Elhage et al. 2021) states the same
property for all tokens at once. We use the direct-path form on the probe's real activations,
made signed so anti-induction (copy-suppressing) heads come out negative:

  for each scored query q of head h, with attended key j* = argmax_k A[q, k] (k >= 1: the BOS
  column is excluded, as in the positional score), t* = token[j*], o = z_h[q] W_O^h:
    u = (o - mean(o)) * gamma_f     the direct path through the final LayerNorm (its 1/sigma
                                    scale is positive and common to all logits, so dropped);
                                    an RMSNorm (Llama, Mistral, Qwen) does not centre: u = o * gamma_f;
                                    Gemma 3 normalises the attention output before the residual
                                    add: o = z_h[q] W_O^h * gamma_a (its 1/rms dropped likewise)
    l = u W_U^T                     direct-path logits, [d_vocab]
    s = (l[t*] - mean(l)) / std(l)  the attended token's standard score among the vocabulary
    copying(q) = erf(s / sqrt(2))   in [-1, 1]: the Gaussian rank of t*'s logit, mapped to
                                    -1 (most suppressed) .. 0 (unrelated) .. +1 (most raised)
copying_score = mean over scored queries. mean(l) and std(l) come in closed form from the
unembedding's mean row m and covariance C (d_model x d_model), never a [pos, d_vocab] tensor.
W_O, the final norm and the unembedding come from the architecture adapter (headlens.arch); with
grouped-query attention each query head's z already carries the key/value head it shares, so the
score is per query head through that head's own slice of W_O.
"""

from __future__ import annotations

import math

import torch

from headlens.arch import adapter_for
from headlens.capture import Batch, Reducer
from headlens.load.devices import is_offloaded, onloaded

# Below this std(l) relative to |u| * rms(W_U) the head writes nothing the unembedding reads
# (e.g. into a subspace orthogonal to it): its copying score is 0, not noise divided by noise.
FLAT_LOGITS_RTOL = 1e-5
# Scored queries folded at a time: the [n, head, d_model] outputs and gathered unembedding rows
# stay ~2.4 MB each at GPT-2 small's shape (12 heads x 768), whatever the batch holds.
FOLD_QUERIES = 64


def unembedding_stats(model, chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Mean row, covariance and rms of the unembedding, and the final norm's gain and kind.

    Accumulated in float64 over chunks of rows, so no float64 copy of [d_vocab, d_model] is made;
    `w_u` is the model's own weight (rows are gathered and promoted on use). `centre`: the final
    norm subtracts the mean (LayerNorm) or not (RMSNorm).
    """
    adapter = adapter_for(model)
    unembed, final_norm = adapter.unembed(), adapter.final_norm()
    with onloaded(unembed):
        w_u = unembed.weight.detach()  # [d_vocab, d_model]
        w_u = w_u.clone() if is_offloaded(unembed) else w_u  # offloaded: kept for the whole run
    with onloaded(final_norm):
        gamma = adapter.final_norm_gain().detach().float().clone()  # [d_model]
    d_vocab, d_model = w_u.shape
    total = torch.zeros(d_model, dtype=torch.float64, device=w_u.device)  # [d_model]
    gram = torch.zeros(d_model, d_model, dtype=torch.float64, device=w_u.device)  # [d_model, d_model]
    for start in range(0, d_vocab, chunk):
        rows = w_u[start : start + chunk].float()  # [chunk, d_model]
        total += rows.sum(0).double()
        gram += (rows.T @ rows).double()  # float32 products per chunk, float64 running sum
    mean, gram = total.cpu() / d_vocab, gram.cpu()  # [d_model], [d_model, d_model]: the scores fold on the CPU
    cov = gram / d_vocab - torch.outer(mean, mean)  # [d_model, d_model]
    return {
        "w_u": w_u,
        "mean": mean.float(),
        "cov": cov.float(),
        "rms": (gram.trace() / (d_vocab * d_model)).sqrt(),
        "gamma": gamma.cpu(),
        "centre": adapter.final_norm_centres,
    }


def unembedding_rows(stats: dict, tokens: torch.Tensor, device) -> torch.Tensor:
    """Rows of the unembedding for token ids [...] as float32 on `device`: [..., d_model]. The
    unembedding stays where the model keeps it; only the gathered rows move."""
    w_u = stats["w_u"]
    return w_u[tokens.to(w_u.device)].to(device=device, dtype=torch.float32)


def copying_per_query(out: torch.Tensor, tokens: torch.Tensor, stats: dict) -> torch.Tensor:
    """copying(q) for head outputs out [n, d_model] and attended tokens [n] -> [n] in [-1, 1].

    Computed in the dtype of `stats` (float32 in classify: a z-score needs no more)."""
    dtype = stats["cov"].dtype
    out = out.to(dtype)
    if stats.get("centre", True):  # a LayerNorm unless the stats say otherwise
        out = out - out.mean(-1, keepdim=True)  # [n, d_model]
    u = out * stats["gamma"]  # [n, d_model]
    target = (u * unembedding_rows(stats, tokens, u.device).to(dtype)).sum(-1)  # [n] l[t*]
    mean = u @ stats["mean"]  # [n] mean(l)
    var = ((u @ stats["cov"]) * u).sum(-1).clamp(min=0)  # [n] var(l): [n, d_model] @ [d_model, d_model]
    return _erf_score(target - mean, var.sqrt(), u, float(stats["rms"]))


def _erf_score(centred: torch.Tensor, std: torch.Tensor, u: torch.Tensor, rms: float) -> torch.Tensor:
    """erf(s / sqrt 2) with s = centred / std; 0 where the logits are flat (see FLAT_LOGITS_RTOL;
    `rms`: the unembedding's, a float so that no tensor is read back to the host)."""
    flat = std <= FLAT_LOGITS_RTOL * u.norm(dim=-1) * rms * math.sqrt(u.shape[-1])
    score = torch.erf(centred / std.clamp(min=torch.finfo(std.dtype).tiny) / math.sqrt(2.0))  # [n]
    return score.masked_fill(flat, 0.0)


class CopyingReducer(Reducer):
    """Streams copying_score for every head (needs pattern and z of each layer).

    `query_fn(batch) -> [batch, q_pos] bool` picks the scored queries from the batch's host
    tensors (classify uses the prefix-matching positions of the repeated-random-token probe).
    Everything computed from activations stays on their device: the attended keys, the folded
    scores and their sums (`Reducer.add_total`, copied to the host once per batch by
    `flush_to_host`); only the query indices, known on the host, travel the other way. With an
    unembedding accelerate keeps off the device, its gathered rows are the one exception.
    `result()` -> [n_layers, n_heads]. With `n_units` (the sequences the run will see), each sequence's
    score sum and scored queries are kept too (`unit_sums`, `unit_n`, rows by the batch's offset): the
    bootstrap's units (headlens.classify.stability).
    """

    wants = frozenset({"pattern", "z"})
    row_blocks = True  # takes patterns in blocks of query rows (capture.Reducer)
    totals = ("sums", "sq_sums", "counts")  # added over processes (headlens.distributed.all_reduce_totals)

    def __init__(self, model, query_fn, layers=None, n_units: int = 0):
        adapter = adapter_for(model)
        n_layers = adapter.n_layers
        self.layers = layers
        self.n_heads, self.d_head = adapter.n_heads, adapter.d_head
        self.stats = unembedding_stats(model)
        self.rms = float(self.stats["rms"])
        self.adapter = adapter  # W_O per head: adapter.w_o(layer), read when a layer is first folded
        self.query_fn = query_fn
        self.sums = torch.zeros(n_layers, self.n_heads, dtype=torch.float64)  # [layer, head]
        self.sq_sums = torch.zeros(n_layers, self.n_heads, dtype=torch.float64)  # [layer, head]
        self.counts = torch.zeros(n_layers, dtype=torch.long)  # [layer]
        self.unit_sums = torch.zeros(n_layers, n_units, self.n_heads, dtype=torch.float64)  # [layer, unit, head]
        self.unit_n = torch.zeros(n_layers, n_units, dtype=torch.float64)  # [layer, unit]
        if n_units:
            self.totals = (*type(self).totals, "unit_sums", "unit_n")
        self._pending: dict[int, dict] = {}  # layer -> attended keys so far and z, until both are whole
        self._maps: dict[tuple, tuple] = {}  # (layer, device) -> (A m, A C A^T)
        self._on_device: dict = {}  # device -> the final norm's gain, m and C there
        self._batch: tuple | None = None  # (batch, scored queries [batch, q_pos] on the host, {key: indices})

    def update(self, layer: int, batch: Batch, pattern=None, z=None, q_start: int = 0) -> None:
        # z and the pattern blocks of a layer arrive in either order (eager: z first; lean: blocks first)
        slot = self._pending.setdefault(layer, {"keys": [], "rows": 0, "n_pos": None})
        if pattern is not None:
            slot["keys"].append(self._attended(batch, pattern.detach(), q_start))
            slot["rows"], slot["n_pos"] = q_start + pattern.shape[-2], pattern.shape[-1]
        if z is not None:
            slot["z"] = z.detach()
        if "z" in slot and slot["rows"] == slot["n_pos"]:
            del self._pending[layer]
            self._fold(layer, batch, slot["keys"], slot["z"])

    def _indices(self, batch: Batch, q_start: int, rows: int, device) -> tuple:
        """Scored queries among rows q_start.. of the batch: (batch index, query position) [n] each,
        on the host and on `device`. Computed once per batch and block (the same for every layer)."""
        if self._batch is None or self._batch[0] is not batch:
            self._batch = (batch, self.query_fn(batch) & batch.mask, {})  # [batch, q_pos] on the host
        _, scored, found = self._batch
        key = (q_start, rows, device)
        if key not in found:
            b_idx, r_idx = scored[:, q_start : q_start + rows].nonzero(as_tuple=True)  # [n], [n]
            q_idx = r_idx + q_start  # [n]
            found[key] = (b_idx, q_idx, b_idx.to(device), q_idx.to(device), r_idx.to(device))
        return found[key]

    def _attended(self, batch: Batch, pattern: torch.Tensor, q_start: int):
        """Scored queries among the block's rows and each head's attended key (BOS column excluded,
        left on the pattern's device)."""
        b_idx, q_idx, b_dev, q_dev, r_dev = self._indices(batch, q_start, pattern.shape[-2], pattern.device)
        keys = pattern[b_dev, :, r_dev, 1:].argmax(-1) + 1  # [n, head]
        return b_idx, q_idx, b_dev, q_dev, keys

    def _fold(self, layer: int, batch: Batch, parts: list, z: torch.Tensor) -> None:
        b_idx, _, b_dev, q_dev, keys = (torch.cat(column) for column in zip(*parts, strict=True))  # [n] x 4, [n, head]
        if len(b_idx) == 0:
            return
        a, m_vec, m_cov = self._layer_maps(layer, z.device)
        ids = self._device_ids(batch, z.device)  # [batch, pos]
        units = slice(batch.offset, batch.offset + len(ids)) if self.unit_n.shape[1] else None
        per_unit = torch.zeros(len(ids), self.n_heads, dtype=torch.float64, device=z.device)  # [batch, head]
        for start in range(0, len(b_idx), FOLD_QUERIES):
            part = slice(start, start + FOLD_QUERIES)
            b_part = b_dev[part].to(keys.device)  # [n]
            tokens = ids[b_part[:, None], keys[part]]  # [n, head]
            zq = z[b_dev[part], q_dev[part]].float()  # [n, head, d_head]
            u = torch.bmm(zq.transpose(0, 1), a).transpose(0, 1)  # [n, head, d_model]: (centred,) norm-scaled outputs
            target = (u * unembedding_rows(self.stats, tokens, u.device)).sum(-1)  # [n, head] l[t*]
            mean = torch.einsum("nhd,hd->nh", zq, m_vec)  # [n, head] mean(l)
            var = (torch.einsum("nhd,hde->nhe", zq, m_cov) * zq).sum(-1).clamp(min=0)  # [n, head] z (A C A^T) z^T
            score = _erf_score(target - mean, var.sqrt(), u, self.rms).double()  # [n, head]
            self.add_total("sums", layer, score.sum(0))
            self.add_total("sq_sums", layer, (score**2).sum(0))
            per_unit.index_add_(0, b_dev[part], score)
        self.counts[layer] += len(b_idx)  # known on the host: no copy
        if units is not None:
            self.add_total("unit_sums", (layer, units), per_unit)
            self.unit_n[layer, units] += torch.bincount(b_idx, minlength=len(ids)).double()

    def _device_ids(self, batch: Batch, device) -> torch.Tensor:
        """The batch's token ids on `device` [batch, pos], moved once per batch."""
        found = self._batch[2]
        if ("ids", device) not in found:
            found["ids", device] = batch.input_ids.to(device)
        return found["ids", device]

    def _layer_maps(self, layer: int, device):
        """Per head A = centre(W_O * gamma_a) * gamma_f [d_head, d_model] (gamma_a: the gain of a norm on the
        attention output, Gemma's; no centring under an RMSNorm), A m [d_head]
        and A C A^T [d_head, d_head]: mean and variance of the direct-path logits from z alone
        (d_head^2, not d_model^2, per query), all on `device` (z's). Only the small A m and A C A^T
        are kept across batches (A C A^T costs a d_model^2 product); A itself, as large as the layer's
        W_O, is rebuilt per call (elementwise). W_O of a layer accelerate offloaded is loaded for the
        read and copied."""
        if device not in self._on_device:
            self._on_device[device] = tuple(self.stats[k].to(device) for k in ("gamma", "mean", "cov"))
        gamma, mean, cov = self._on_device[device]  # [d_model], [d_model], [d_model, d_model]
        with onloaded(self.adapter.z_module(layer)):
            w_o = self.adapter.w_o(layer).detach().to(device, torch.float32, copy=True)  # [head, d_head, d_model]
        gain = self.adapter.attn_out_gain(layer)  # a norm before the residual add (Gemma): its gain is on the path
        if gain is not None:
            w_o = w_o * gain.detach().to(device, torch.float32)  # [head, d_head, d_model]
        if self.stats["centre"]:
            w_o = w_o - w_o.mean(-1, keepdim=True)  # [head, d_head, d_model]
        a = w_o * gamma  # [head, d_head, d_model]
        if (layer, device) not in self._maps:
            self._maps[layer, device] = (
                a @ mean,
                a @ cov @ a.transpose(1, 2),
            )  # [head, d_head], [head, d_head, d_head]
        return (a, *self._maps[layer, device])

    def result(self) -> torch.Tensor:
        """Mean copying score, [n_layers, n_heads] (NaN where nothing was scored)."""
        self.flush()
        mean = self.sums / self.counts[:, None].clamp(min=1)
        return mean.where(self.counts[:, None] > 0, torch.tensor(float("nan"), dtype=torch.float64)).float()

    def std(self) -> torch.Tensor:
        """Spread across scored queries, [n_layers, n_heads]."""
        self.flush()
        n = self.counts[:, None].clamp(min=1)
        mean = self.sums / n
        return (self.sq_sums / n - mean**2).clamp(min=0).sqrt().float()
