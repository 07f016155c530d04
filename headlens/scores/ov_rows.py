"""Which tokens' own logits lie in the bottom k of their row of a head's vocabulary logits
z W_O W_U (headlens.scores.ov_vocab's criterion), without forming W_O W_U for every head.

A token t's row is z_t W_O W_U [d_vocab]: its value z_t [d_head] through the head's output weights
(folded, [d_head, d_model]) and the unembedding W_U [d_model, d_vocab]. It counts when fewer than k
entries lie strictly below its own entry (column t). Most rows are decided on a part of the vocabulary:
- the filter (undecided) scores every row on every PART_STRIDE-th column of W_U (the own column left
  out of the count); a row with k or more of those entries below its own logit by more than the
  rounding margin (below) certainly does not count;
- the rows left open are scanned over the whole vocabulary BLOCK columns at a time (whole_rows). Few
  rows go through the residual stream in float32, keeping each row's k smallest entries; the own
  entry is read from its block's product, so the token never counts against itself, and a row leaves
  the scan as soon as k entries lie below its own logit by more than the margin. Many rows (more than
  the residual route's limit, below) meet A = W_O W_U [d_head, d_vocab], formed once for the head, in
  headlens.scores.rank_scan: entries of -z A above the own one, screened in bfloat16 and checked in
  float32 near the own entry, a row leaving at k. In the d_head basis of A the entries of a row
  spread widely enough for the screen to decide nearly all of them, unlike the residual basis
  (BENCHMARKS.md). A row that counts (the criterion's hits) is always scanned to the end.

Routes (through_residual): n rows of a head cost 2 n d_model c FLOPs on c columns through the
residual stream ((z W_O) W_U) and 2 d_head d_model c + 2 n d_head c by forming A = W_O W_U on those
columns first (z A); the residual route is taken when n d_model <= d_head (d_model + n), i.e. n <=
d_head d_model / (d_model - d_head) rows (SmolLM2: 72, Gemma 3 270M: 426). The filter (c = d_vocab
/ PART_STRIDE, all the heads' rows of a chunk), a head's whole-row scan (c = d_vocab, its open rows)
and each block of the residual scan (c = BLOCK, the rows still open) choose alike.

Rounding margin: every product here is float32 from the same float32 z, W_O and W_U, and a product
of length d_model + d_head errs by at most gamma = n u / (1 - n u), n = d_model + d_head, u = 2^-24,
times (|z| |W_O|) |W_U_j| <= s_t c (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
section 3.5), with s_t = || |z_t| |W_O| ||_2 and c the largest column norm of W_U. An entry more than
4 gamma s_t c below the own logit in one computation is strictly below it in any other float32
computation within that bound, by either route: deciding a row early never changes its outcome from
the one its whole row, computed in one product, gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headlens.scores.rank_scan import columns, count_above

PART_STRIDE = 32  # the filter reads every 32nd column of W_U
BLOCK = 8192  # vocabulary columns per step of a whole-row scan ([rows, BLOCK] float32)
FILTER_CHUNK = 512  # rows per filter block ([head, chunk, d_vocab / PART_STRIDE] float32)
UNIT_ROUNDOFF = 2.0**-24  # float32


@dataclass(frozen=True)
class Unembed:
    """The folded unembedding as the filter reads it, prepared once for every layer: `w_u` [d_model,
    d_vocab] float32, `columns` [p] (every PART_STRIDE-th id), `part` = w_u[:, columns] [d_model, p],
    `largest` the largest column norm of w_u (c of the module docstring)."""

    w_u: torch.Tensor
    columns: torch.Tensor
    part: torch.Tensor
    largest: float


def prepare(w_u: torch.Tensor) -> Unembed:
    """Unembed of the folded unembedding w_u [d_model, d_vocab] (converted to float32)."""
    w_u = w_u.float()
    columns = torch.arange(0, w_u.shape[1], PART_STRIDE)  # [p]
    largest = max(float(part.double().norm(dim=0).max()) for part in w_u.split(4096, dim=1))
    return Unembed(w_u, columns, w_u[:, columns].contiguous(), largest)


def through_residual(n: int, d_head: int, d_model: int) -> bool:
    """Whether n rows of one head are cheaper through the residual stream, 2 n d_model FLOPs per column,
    than by forming W_O W_U, 2 d_head (d_model + n) per column (module docstring)."""
    return n * d_model <= d_head * (d_model + n)


def head_logits(z: torch.Tensor, w_o: torch.Tensor, w_u: torch.Tensor) -> torch.Tensor:
    """z W_O W_U by the cheaper route: z [head, n, d_head], w_o [head, d_head, d_model], w_u [d_model,
    c] (float32) -> [head, n, c] float32."""
    if through_residual(z.shape[1], w_o.shape[1], w_o.shape[2]):
        return (z @ w_o) @ w_u  # [head, n, d_model] @ [d_model, c]
    return z @ (w_o @ w_u)  # [head, n, d_head] @ [head, d_head, c]


def below_threshold(z: torch.Tensor, w_o: torch.Tensor, unembed: Unembed, tokens: torch.Tensor) -> torch.Tensor:
    """Each row's own logit less the rounding margin 4 gamma s_t c (module docstring), rounded down to
    float32: z [head, n, d_head], w_o [head, d_head, d_model], tokens [n] -> [head, n]."""
    own = ((z @ w_o) * unembed.w_u[:, tokens].T).sum(-1).double()  # [head, n]: z_t W_O W_U[:, t]
    n = w_o.shape[1] + w_o.shape[2]
    gamma = n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)
    spread = (z.abs() @ w_o.abs()).double().norm(dim=-1)  # [head, n]: s_t
    exact = own - 4 * gamma * spread * unembed.largest  # [head, n]
    low = exact.float()  # [head, n]
    return torch.where(low.double() > exact, torch.nextafter(low, torch.tensor(-torch.inf)), low)


def undecided(z: torch.Tensor, w_o: torch.Tensor, unembed: Unembed, tokens: torch.Tensor, k: int):
    """The rows the filter leaves open (module docstring): z [head, n, d_head], w_o [head, d_head,
    d_model] (float32), tokens [n] -> ([head, n] bool, True: score the whole row; the rows' thresholds
    below_threshold [head, n])."""
    out, thresholds = [], []
    for start in range(0, len(tokens), FILTER_CHUNK):
        rows, token = slice(start, start + FILTER_CHUNK), tokens[start : start + FILTER_CHUNK]
        threshold = below_threshold(z[:, rows], w_o, unembed, token)  # [head, chunk]
        logits = head_logits(z[:, rows], w_o, unembed.part)  # [head, chunk, p]
        other = token[:, None] != unembed.columns  # [chunk, p]: the own column does not count
        out.append(((logits < threshold[..., None]) & other).sum(-1) < k)  # [head, chunk]
        thresholds.append(threshold)
    return torch.cat(out, 1), torch.cat(thresholds, 1)  # [head, n] each


def whole_rows(z: torch.Tensor, w_o: torch.Tensor, w_u: torch.Tensor, tokens: torch.Tensor, threshold, k: int):
    """Whether fewer than k entries of each whole row z W_O W_U lie strictly below its own entry, for one
    head: z [u, d_head], w_o [d_head, d_model], w_u [d_model, d_vocab] (float32), tokens [u], threshold
    [u] (below_threshold) -> [u] bool. Rows past the residual route's limit go to product_rows;
    the others meet the vocabulary BLOCK columns at a time through the residual stream (each block
    small enough to stay in cache), keeping each row's k smallest entries so far;
    the own entry is read from its block's product, so the token never counts against itself, and a
    row counts when its own entry is at most the k-th smallest of the row (itself among them). A row
    whose k-th smallest so far is below its threshold certainly does not count and leaves the scan."""
    if not through_residual(len(tokens), *w_o.shape):
        return product_rows(z, w_o, w_u, tokens, k)
    smallest = torch.full((len(tokens), k), torch.inf)  # [u, k]
    own = torch.full((len(tokens),), torch.inf)  # [u]
    live = torch.arange(len(tokens))  # [l]: rows still open
    for start in range(0, w_u.shape[1], BLOCK):
        block = w_u[:, start : start + BLOCK]  # [d_model, b]
        logits = head_logits(z[live][None], w_o[None], block)[0]  # [l, b]
        low = logits.topk(min(k, block.shape[1]), dim=-1, largest=False).values  # [l, <= k]
        smallest[live] = torch.cat([smallest[live], low], 1).topk(k, dim=-1, largest=False).values
        inside = ((tokens[live] >= start) & (tokens[live] < start + block.shape[1])).nonzero().flatten()  # [i]
        own[live[inside]] = logits[inside, tokens[live[inside]] - start]
        live = live[smallest[live, -1] >= threshold[live]]  # [l']
        if not len(live):
            break
    return own <= smallest[:, -1]  # [u]: a row that left the scan has own = inf or k entries below


def product_rows(z: torch.Tensor, w_o: torch.Tensor, w_u: torch.Tensor, tokens: torch.Tensor, k: int):
    """whole_rows for many rows of one head: A = W_O W_U formed once (w_o [d_head, d_model] @ w_u [d_model,
    d_vocab] -> [d_head, d_vocab] float32), then headlens.scores.rank_scan counts the entries of each row
    -z A above its own (z [u, d_head], tokens [u]), BLOCK columns at a time, a row leaving at k -> [u] bool."""
    product = w_u.T @ w_o.T  # [d_vocab, d_head]: A's columns as rows, so that a column is read at once
    return count_above(-z, columns(product.T), tokens, k, BLOCK) < k  # [u]


def filtered_hits(z: torch.Tensor, w_o: torch.Tensor, unembed: Unembed, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Whether fewer than k vocabulary entries lie strictly below each token's own entry of z W_O W_U,
    per head (module docstring): z [n, head, d_head] (float64 or float32), w_o [head, d_head, d_model]
    (folded), tokens [n] -> [head, n] bool."""
    z32, w_o32 = z.transpose(0, 1).float().contiguous(), w_o.float()  # [head, n, d_head], [head, d_head, d_model]
    k = min(k, unembed.w_u.shape[1])  # a vocabulary of at most k tokens: every token is in its bottom k
    hits = torch.zeros(z32.shape[:2], dtype=torch.bool)  # [head, n]
    rows, thresholds = undecided(z32, w_o32, unembed, tokens, k)  # [head, n] each
    for head in range(len(rows)):
        picked = rows[head].nonzero().flatten()  # [u]
        if len(picked):
            hits[head, picked] = whole_rows(
                z32[head, picked], w_o32[head], unembed.w_u, tokens[picked], thresholds[head, picked], k
            )
    return hits
