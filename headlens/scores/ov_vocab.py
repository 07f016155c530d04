"""The copy-suppression OV criterion over the vocabulary (McDougall et al. 2023, arXiv 2310.04625,
section 3): a token t counts for a head when t's own entry ranks among the BOTTOM_K lowest of its
column of W_U W_OV W_EE (the logits the head writes from t's effective embedding); a head's score is
the share of the vocabulary's tokens that count.

W_EE here is the paper's (its code's "W_E (including MLPs)"): the residual stream after layer 0 for
the token alone, layer 0's attention locked on the token itself, x + attn0(x) + MLP0(...); value and
output biases are left out (SmolLM2 and Llama-type models have none). headlens.scores.ov_circuit's
W_EE leaves layer 0's attention out; on SmolLM2 that moves 24.4 from 0.58 to 0.46 and 23.3 from 0.56
to 0.59 (BENCHMARKS.md), so the copy-suppression criterion uses the paper's.

Exact over the whole vocabulary when it has at most VOCAB_SAMPLE tokens; otherwise on a seeded uniform
sample of the vocabulary, in two nested stages, with a 95% Wilson interval per head:
- every head is scored on the sample's first SCREEN tokens; a head with no token counted there has a
  Wilson interval [0, 0.039] (half-width <= CI_HALF_WIDTH) and stops;
- every other head is scored on all VOCAB_SAMPLE tokens (the SCREEN ones included): a half-width
  <= 0.020 at any share (1.96 sqrt(0.25 / 2401) = 0.0200).
(Which heads go on depends on the screen, so the stated interval is a close, not exact, 95%.)

Cost: W_OV has rank d_head, so a head's logits are z W_O W_U with z = the value of W_EE(t)
[d_head]. headlens.scores.ov_rows decides most tokens on every 32nd column of W_U (exactly: a
rounding margin keeps the outcome a whole row would give) and scans the whole vocabulary only for the
rest, each block by the cheaper of z (W_O W_U) and (z W_O) W_U; W_O W_U is never formed for a whole
vocabulary at once (forming it for all 72 heads of Gemma 3 270M, d_vocab 262,144, would be ~6 TFLOP).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from headlens.arch import adapter_for
from headlens.load.devices import onloaded
from headlens.scores.ov_copying import folded_unembed, value_change
from headlens.scores.ov_rows import filtered_hits, prepare

BOTTOM_K = 10  # the token's own logit among the 10 lowest of its column
VOCAB_SAMPLE = 2401  # tokens of the full sample: Wilson 95% half-width <= 0.020 at any share
SCREEN = 96  # tokens every head is scored on: 0 of 96 gives [0, 0.039]
CI_HALF_WIDTH = 0.02
Z_95 = 1.959964


def wilson(hits: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """95% Wilson score interval of hits / n (elementwise, float64): (low, high)."""
    hits, n = hits.double(), n.double()
    p, z2 = hits / n, Z_95**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 * torch.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return centre - half, centre + half


def vocab_sample(d_vocab: int, seed: int = 0, n: int = VOCAB_SAMPLE) -> torch.Tensor:
    """The vocabulary in a seeded random order, its first min(n, d_vocab) ids: [m] int64 (the whole
    vocabulary, in that order, when d_vocab <= n)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(d_vocab, generator=gen)[:n]


def self_attention_embedding(adapter, token_ids: torch.Tensor) -> torch.Tensor:
    """W_EE with layer 0's attention locked on the token itself (module docstring): [n, d_model]."""
    embed = adapter.embed()
    groups = torch.tensor([adapter.kv_group(h) for h in range(adapter.n_heads)])  # [head]
    with torch.no_grad():
        x = embed(token_ids.to(embed.weight.device)[:, None])  # [n, 1, d_model]
        z = value_change(adapter, 0, x[:, 0]).double()  # [n, kv_head, d_head]
        with onloaded(adapter.z_module(0)):
            w_o = adapter.w_o(0).detach().double().to(z.device)  # [head, d_head, d_model]
        # the query heads of a key/value group read the same value: their W_O summed first (float64)
        shared = w_o.new_zeros(z.shape[1], *w_o.shape[1:]).index_add_(0, groups.to(z.device), w_o)
        attn = (z.flatten(1) @ shared.flatten(0, 1)).to(x.dtype)  # [n, d_model]: every head on itself
        return adapter.finish_block(0, x, attn[:, None])[:, 0]  # [n, d_model] (a norm on attn0 applied there)


def folded_w_o(adapter, layer: int) -> torch.Tensor:
    """W_O of every query head of `layer`, with a norm on the attention output (its gain) and
    LayerNorm's centring folded in as headlens.scores.ov_circuit.head_outputs applies them:
    [head, d_head, d_model] float64 (cpu). z @ folded_w_o @ the folded unembedding are a head's logits."""
    with onloaded(adapter.z_module(layer)):
        w_o = adapter.w_o(layer).detach().double().cpu()  # [head, d_head, d_model]
    gain = adapter.attn_out_gain(layer)
    if gain is not None:
        w_o = w_o * gain.detach().double().cpu()  # [head, d_head, d_model]
    if adapter.final_norm_centres:
        w_o = w_o - w_o.mean(-1, keepdim=True)  # LayerNorm's centring
    return w_o


def cs_ov_vocab(
    model,
    seed: int = 0,
    screen: int = SCREEN,
    sample: int = VOCAB_SAMPLE,
    layers: Sequence[int] | None = None,
    progress: bool = False,
) -> dict:
    """The OV criterion of every head over the vocabulary (module docstring): `cs_ov_score`, `n` (tokens
    scored), `ci_low`, `ci_high` (95% Wilson), `se` (sqrt(p(1-p)/n), 0 when exact), each [n_layers,
    n_heads] (NaN, n = 0 outside `layers` when only some are asked for); `exact` (the whole vocabulary
    was scored), `d_vocab`, `screen`, `sample`. `progress`: a bar over the layers on stderr."""
    adapter = adapter_for(model)
    unembed = prepare(folded_unembed(adapter).detach().cpu())  # [d_model, d_vocab], converted once for every layer
    d_vocab = unembed.w_u.shape[1]
    tokens = vocab_sample(d_vocab, seed, sample)  # [m]
    resid = self_attention_embedding(adapter, tokens).detach()  # [m, d_model]
    groups = torch.tensor([adapter.kv_group(h) for h in range(adapter.n_heads)])

    def layer_hits(layer: int):
        z = value_change(adapter, layer, resid).double().cpu()[:, groups]  # [m, head, d_head]
        w_o = folded_w_o(adapter, layer)  # [head, d_head, d_model]
        return lambda heads, rows: filtered_hits(z[rows, heads], w_o[heads], unembed, tokens[rows], BOTTOM_K).sum(-1)

    with torch.no_grad():
        return screened_shares(layer_hits, adapter, tokens, d_vocab, screen, layers, "cs_ov_score", progress)


def screened_shares(
    layer_hits, adapter, tokens: torch.Tensor, d_vocab: int, screen: int, layers, name: str, progress: bool = False
) -> dict:
    """The two-stage share of the module docstring, for any per-token criterion. layer_hits(layer)
    returns a function (heads [k] int64, rows slice of `tokens`) -> hits [k] int64. Returns `name`,
    `n`, `ci_low`, `ci_high`, `se` [n_layers, n_heads] each and `exact`, `d_vocab`, `screen`, `sample`.
    `progress`: a bar over the layers (named `name`, with tqdm's estimate of the time left) on stderr."""
    exact = len(tokens) == d_vocab
    first = len(tokens) if exact else min(screen, len(tokens))
    shape = (adapter.n_layers, adapter.n_heads)
    hits, counted = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    every = torch.arange(adapter.n_heads)
    chosen = range(adapter.n_layers) if layers is None else layers
    for layer in tqdm(chosen, desc=name, unit="layer", leave=False, disable=not progress):
        count = layer_hits(layer)
        hits[layer], counted[layer] = count(every, slice(0, first)), first
        more = (hits[layer] > 0).nonzero().flatten() if not exact else every[:0]  # [k]
        if len(more) and len(tokens) > first:
            hits[layer, more] += count(more, slice(first, len(tokens)))
            counted[layer, more] = len(tokens)
    share = hits.double() / counted.double()  # [layer, head]
    low, high = wilson(hits, counted)
    se = torch.zeros_like(share) if exact else (share * (1 - share) / counted).sqrt()
    return {
        name: share,
        "n": counted,
        "ci_low": low,
        "ci_high": high,
        "se": se,
        "exact": exact,
        "d_vocab": d_vocab,
        "screen": first,
        "sample": len(tokens),
    }


def wilson_half_width(n: int, share: float = 0.5) -> float:
    """The 95% Wilson half-width at `share` of n tokens (the widest is at 0.5)."""
    z2 = Z_95**2
    return Z_95 * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
