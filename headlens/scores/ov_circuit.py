"""A head's OV circuit applied to chosen tokens: W_U W_OV W_EE, read from the weights.

The effective embedding W_EE(t) = x + MLP0(norm(x)), x = W_E t, is the residual stream a token
leaves layer 0 with when layer 0's attention is left out (McDougall et al. 2023, "Copy
Suppression", arXiv 2310.04625, section 3; Gould et al. 2023, "Successor Heads", arXiv
2312.09230, use the same effective embedding). Layer L's head h reads it through the layer's
input norm and its value projection (v(x) - v(0), so biases drop out: the circuit is a linear map,
as in headlens.scores.ov_copying) and writes z_h W_O^h, times the gain of a norm on the attention
output where there is one (Gemma's post-attention norm; its 1/rms is one positive factor on all of
a token's logits, left out); the unembedding reads that with the final norm's gain folded in (and
LayerNorm's centring applied). Families differ only through the architecture adapter: any
tokenizer, any supported model.
"""

from __future__ import annotations

import torch

from headlens.arch import adapter_for
from headlens.load.devices import onloaded
from headlens.scores.ov_copying import folded_unembed, value_change

VOCAB_CHUNK = 512  # unembedding rows per matmul when ranking over the whole vocabulary (logits kept in cache)


def effective_embedding(adapter, token_ids: torch.Tensor) -> torch.Tensor:
    """W_EE of `token_ids` [n]: [n, d_model] (float32 or the model's dtype)."""
    embed = adapter.embed()
    device = embed.weight.device
    with torch.no_grad():
        x = embed(token_ids.to(device)[:, None])  # [n, 1, d_model]
        zero = torch.zeros_like(x)  # [n, 1, d_model]: layer 0's attention left out
        return adapter.finish_block(0, x, zero)[:, 0]  # [n, d_model]


def head_outputs(model, token_ids: torch.Tensor, resid: torch.Tensor | None = None) -> torch.Tensor:
    """Every head's OV output for each token's effective embedding (or for `resid` [n, d_model], the
    tokens' residual vectors taken elsewhere, e.g. after layer 0 in a prompt), before the unembedding:
    [n_layers, n_heads, n, d_model] (float64; LayerNorm centring applied when the final norm centres)."""
    adapter = adapter_for(model)
    resid = effective_embedding(adapter, token_ids) if resid is None else resid  # [n, d_model]
    outs = []
    with torch.no_grad():
        for layer in range(adapter.n_layers):
            v = value_change(adapter, layer, resid).double()  # [n, kv_head, d_head]
            with onloaded(adapter.z_module(layer)):
                w_o = adapter.w_o(layer).double().to(v.device)  # [head, d_head, d_model]
            gain = adapter.attn_out_gain(layer)  # a norm on the attention output (Gemma): its gain is on the path
            if gain is not None:
                w_o = w_o * gain.detach().double().to(v.device)  # [head, d_head, d_model]
            groups = torch.tensor([adapter.kv_group(h) for h in range(adapter.n_heads)], device=v.device)
            z = v[:, groups]  # [n, head, d_head]
            out = torch.einsum("nhd,hdm->hnm", z, w_o)  # [head, n, d_model]
            if adapter.final_norm_centres:
                out = out - out.mean(-1, keepdim=True)  # LayerNorm's centring
            outs.append(out)
    return torch.stack(outs)  # [layer, head, n, d_model]


def ov_logits(model, token_ids: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Logits of the tokens `columns` [c] written by every head's OV circuit from each of
    `token_ids` [n]: [n_layers, n_heads, n, c] (float64)."""
    w_u = folded_unembed(adapter_for(model))  # [d_model, d_vocab]
    outs = head_outputs(model, token_ids)  # [layer, head, n, d_model]
    return outs @ w_u[:, columns.to(w_u.device)].to(outs.device)  # [layer, head, n, c]


def own_ranks(model, token_ids: torch.Tensor, resid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each token's own logit falls in its OV output (from its effective embedding, or from
    `resid` [n, d_model] as head_outputs takes it) over the whole vocabulary:
    (above, below), each [n_layers, n_heads, n] int64: how many vocabulary tokens get a strictly
    larger (smaller) logit than the token itself. above < k: the token is in the top k. Ranked in
    float32 (a full-vocabulary pass per head is the cost; float32 ties only where logits tie exactly;
    _count_around_own)."""
    above, below = _count_around_own(model, token_ids, resid, None)
    return above.long(), below.long()


def own_extremes(
    model, token_ids: torch.Tensor, k: int, resid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each token's own logit in its OV output is among the k largest and among the k smallest
    of the vocabulary: (above < k, below < k) of own_ranks, each [n_layers, n_heads, n] bool, from the
    same float32 products. A (head, token) row leaves the scan once k tokens lie above it and k below
    (it is in neither extreme, whatever the rest holds); a token in an extreme is scanned to the end.
    Most tokens of most heads leave in the first block."""
    above, below = _count_around_own(model, token_ids, resid, k)
    return above < k, below < k


def _count_around_own(model, token_ids: torch.Tensor, resid: torch.Tensor | None, k: int | None):
    """(above, below) [n_layers, n_heads, n] int32 (cpu) of own_ranks. The unembedding is read in
    VOCAB_CHUNK-row blocks whose logits stay in cache while they are compared; the token's own column,
    counted by those comparisons against `own` (the same logit from another matmul, so rounding may
    put it above or below), is taken back out. With `k`, a (head, token) row stops once both of its
    counts reach k (its counts are then exact only up to k)."""
    w_u = folded_unembed(adapter_for(model))  # [d_model, d_vocab]
    outs = head_outputs(model, token_ids, resid)  # [layer, head, n, d_model]
    w_t = w_u.T.to(outs.device).float().contiguous()  # [d_vocab, d_model]
    ids = token_ids.to(outs.device)  # [n]
    own = torch.einsum("lhnm,nm->lhn", outs.float(), w_t[ids])  # [layer, head, n]
    n_layers, n_heads, n = own.shape
    above = torch.zeros(n_layers, n_heads * n, dtype=torch.int32, device=own.device)  # [layer, head * n]
    below = torch.zeros_like(above)
    row_ids = ids.repeat(n_heads)  # [head * n]: the token of each (head, token) row
    for layer in range(n_layers):
        rows, mine = outs[layer].float().flatten(0, 1), own[layer].flatten()  # [head * n, d_model], [head * n]
        live = torch.arange(len(rows), device=own.device)  # [l]: rows still open
        for start in range(0, w_t.shape[0], VOCAB_CHUNK):
            picked = rows if k is None else rows[live]  # [l, d_model]
            logits = torch.nn.functional.linear(picked, w_t[start : start + VOCAB_CHUNK])  # [l, chunk]
            limit, token = mine[live, None], row_ids[live]  # [l, 1], [l]
            up = (logits > limit).sum(-1, dtype=torch.int32)  # int32: twice as fast as bool's int64 sum
            down = (logits < limit).sum(-1, dtype=torch.int32)
            inside = ((token >= start) & (token < start + logits.shape[-1])).nonzero().flatten()  # own column here
            self_logit = logits[inside, token[inside] - start]  # [i]
            up[inside] -= (self_logit > limit[inside, 0]).int()
            down[inside] -= (self_logit < limit[inside, 0]).int()
            above[layer, live] += up
            below[layer, live] += down
            if k is not None:
                live = live[(above[layer, live] < k) | (below[layer, live] < k)]  # [l']
                if not len(live):
                    break
    shape = (n_layers, n_heads, n)
    return above.view(shape).cpu(), below.view(shape).cpu()
