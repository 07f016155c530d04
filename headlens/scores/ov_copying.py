"""Copying read from the weights: the OV circuit's eigenvalues (Elhage et al. 2021).

"A Mathematical Framework for Transformer Circuits" (transformer-circuits.pub, 2021): a head's
full OV circuit W_E W_V^h W_O^h W_U maps a token attended to onto the logits it writes. A copying
head raises the attended token itself, which shows as mostly positive eigenvalues; a suppressing
head (copy suppression, McDougall et al. 2023) as mostly negative ones. Score:
  ov_copying_score(h) = sum(lambda) / sum(|lambda|)  in [-1, 1]   (lambda complex; sum(lambda) is real).
Here:
- W_E is the token embedding passed through the head's own layer's input norm, the norm's bias
  removed (for layer 0, the first layer norm folded in as Elhage et al. do); W_V^h is the value
  projection of the site table (`Adapter.qkv_weights`, the weights the from-scratch attention
  is validated with on every family), read as the change of the head's value v(x) - v(0), so a
  value bias drops out and grouped key/value heads are used as the model groups them;
- W_U is the unembedding with the final norm's gain folded in (and, for LayerNorm, its centring
  folded into W_O; for Gemma 3, the gain of the norm on the attention output folded into W_O);
  biases are dropped: eigenvalues are a property of the linear map.
The nonzero eigenvalues of (W_E W_V)(W_O W_U), a [d_vocab, d_vocab] matrix of rank d_head, equal
those of (W_O W_U)(W_E W_V) = W_O (W_U W_E W_V), [d_head, d_head]. The vocabulary-long product
W_U (W_E W_V) is made once per key/value head and shared by the query heads that read it.
Where every layer's input norm is gain-type (norm_L(x) - norm_L(0) = N(x) g_L, checked:
_shared_read), W_U N(E) g_0 [d_model, d_model] is made once for the whole model and each layer
costs one [d_model, d_model] @ [d_model, kv_head * d_head] product; otherwise each layer passes
the vocabulary through its value projection and makes W_U (W_E W_V) itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from headlens.arch import adapter_for, get_module
from headlens.load.devices import onloaded

CHUNK = 4096  # vocabulary rows per pass through a layer's attention
# How far norm_L(x) - norm_L(0) may sit from N(x) g_0 (g_L / g_0), relative to the magnitudes it is
# computed from: a few float32 ulps (2^-24 each) of rounding, never a different function.
GAIN_RTOL = 16 * 2.0**-24
PROBE = 256  # rows per criterion of _probe_rows


def ov_copying_scores(model) -> torch.Tensor:
    """sum(eig) / sum(|eig|) of every head's full OV circuit: [n_layers, n_heads] (float64)."""
    adapter = adapter_for(model)
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    w_u = folded_unembed(adapter)  # [d_model, d_vocab]
    with torch.no_grad():
        shared = _shared_read(adapter, w_u)  # (W_U N(E) G_0, G_L / G_0) or None
        for layer in range(adapter.n_layers):
            through = _through(adapter, layer, w_u, shared)  # [d_model, kv_head, d_head]
            with onloaded(adapter.z_module(layer)):  # W_O of a layer accelerate offloaded, copied
                w_o = adapter.w_o(layer).double()  # [head, d_head, d_model]
            gain = adapter.attn_out_gain(layer)  # a norm on the attention output (Gemma): its gain is on the path
            if gain is not None:
                w_o = w_o * gain.detach().double()  # [head, d_head, d_model]
            if isinstance(adapter.final_norm(), torch.nn.LayerNorm):
                w_o = w_o - w_o.mean(-1, keepdim=True)  # LayerNorm's centring, folded in
            for head in range(adapter.n_heads):
                small = w_o[head] @ through[:, adapter.kv_group(head)]  # [d_head, d_head]
                eig = torch.linalg.eigvals(small)  # [d_head] complex
                total = float(eig.abs().sum())
                out[layer, head] = float(eig.sum().real) / total if total > 0 else 0.0
    return out


def _through(adapter, layer: int, w_u: torch.Tensor, shared) -> torch.Tensor:
    """W_U (W_E W_V) of `layer`'s key/value heads: [d_model, kv_head, d_head] (float64). With the
    shared read, (W_U N(E) G_0)(G_L / G_0) W_V^T: one [d_model, d_model] product per layer."""
    if shared is None:
        values = _token_values(adapter, layer)  # [d_vocab, kv_head, d_head]
        flat = w_u @ values.flatten(1)  # [d_model, kv_head * d_head]
    else:
        read, ratios = shared  # [d_model, d_model], [layer, d_model]
        block = adapter.layer(layer)
        with onloaded(get_module(block, adapter.sites.v.projection)):  # offloaded by accelerate
            w_v = adapter.qkv_weights(layer)[2][0].detach().double()  # [kv_head * d_head, d_model]
        flat = (read * ratios[layer]) @ w_v.T  # [d_model, kv_head * d_head]
    return flat.view(-1, adapter.n_kv_heads, adapter.d_head)  # [d_model, kv_head, d_head]


def _shared_read(adapter, w_u: torch.Tensor):
    """For gain-type input norms (RMSNorm, Gemma's (1 + w) RMSNorm, LayerNorm's centring and
    scaling), norm_L(x) - norm_L(0) = N(x) * g_L with N the same in every layer, so the
    vocabulary-long product W_U (N(E) g_L) is (W_U N(E) g_0) (g_L / g_0): made once.
    Returns (W_U N(E) g_0 [d_model, d_model] float64, g_L / g_0 [n_layers, d_model] float64), or
    None where a layer's norm is not of that form on the probe rows (_probe_rows), each element
    compared within float32 rounding (then every layer reads the whole vocabulary itself)."""
    module = adapter.embed()
    n_vocab, device = module.weight.shape[0], module.weight.device
    read = torch.zeros(w_u.shape[0], w_u.shape[0], dtype=torch.float64)  # [d_model, d_model]
    spread = []  # (rms, centred std) of each token's embedding, [chunk, 2] each
    for start in range(0, n_vocab, CHUNK):
        resid = module(torch.arange(start, min(start + CHUNK, n_vocab), device=device))  # [chunk, d_model]
        base = _norm_change(adapter, 0, resid)[0]  # [chunk, d_model]
        read += w_u[:, start : start + CHUNK] @ base.double()  # [d_model, chunk] @ [chunk, d_model]
        spread.append(torch.stack([resid.pow(2).mean(-1), resid.var(-1)], -1).cpu())  # [chunk, 2]
    resid = module(_probe_rows(torch.cat(spread)).to(device))  # [probe, d_model]
    base, base_zero = _norm_change(adapter, 0, resid)  # [probe, d_model], [1, d_model]
    ratios = []  # g_L / g_0 per layer, [d_model] each
    for layer in range(adapter.n_layers):
        change, zero = _norm_change(adapter, layer, resid)  # [probe, d_model], [1, d_model]
        ratio = _ratio(base, change)  # [d_model]
        scale = change.abs() + zero.abs() + (ratio * base_zero).abs()  # [probe, d_model]
        if ((change - base * ratio).abs() > GAIN_RTOL * scale).any():
            return None
        ratios.append(ratio)
    return read, torch.stack(ratios).double()


def _probe_rows(spread: torch.Tensor) -> torch.Tensor:
    """Token ids the gain form is checked on: the PROBE smallest and largest by embedding rms and
    by centred spread (where a layer-dependent epsilon or centring would show) and PROBE spaced
    through the vocabulary. spread: [d_vocab, 2] -> [n] int64."""
    n_vocab, k = spread.shape[0], min(PROBE, spread.shape[0])
    picks = [torch.linspace(0, n_vocab - 1, k).long()]  # [k]
    for column in spread.T:  # [d_vocab]
        order = column.argsort()  # [d_vocab]
        picks += [order[:k], order[-k:]]  # [k] each
    return torch.cat(picks).unique()  # [n]


def _norm_change(adapter, layer: int, resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x) - norm(0) [..., d_model], norm(0) [1, d_model]) of `layer`'s input norm."""
    norm = get_module(adapter.layer(layer), adapter.sites.input_norm)
    with onloaded(norm):
        zero = norm(torch.zeros(1, resid.shape[-1], dtype=resid.dtype, device=resid.device))  # [1, d_model]
        return (norm(resid) - zero).cpu(), zero.cpu()


def _ratio(base: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
    """Least-squares g_L / g_0 per dimension from change = base * ratio: [d_model] (float32; 0 where
    base is 0, so a gain that is 0 in the first layer only fails the check)."""
    base, change = base.double(), change.double()  # [chunk, d_model]
    den = (base * base).sum(0)  # [d_model]
    return torch.where(den > 0, (base * change).sum(0) / den.clamp_min(1e-300), 0.0).float()


# Inside `folding_once()`: the folded unembeddings made so far, {key: (source tensors, folded)}; the
# unembedding and final-norm tensors are held so that their ids stay theirs while the entry lives.
_FOLDED: ContextVar[dict | None] = ContextVar("folded_unembed", default=None)


@contextmanager
def folding_once() -> Iterator[None]:
    """Within this block folded_unembed makes each model's folded unembedding once and hands the same
    tensor to every later caller (read-only), as long as the unembedding and the final norm's parameters
    are the same tensors, unchanged in place (their version counters). For Gemma 3's [262,144 x 640]
    unembedding the fold is costly and classify's probes ask for it several times. Outside the block
    every call makes its own."""
    token = _FOLDED.set({})
    try:
        yield
    finally:
        _FOLDED.reset(token)


def folded_unembed(adapter) -> torch.Tensor:
    """The unembedding with the final norm's gain folded in: [d_model, d_vocab] (float64). Made once per
    model inside folding_once(); callers do not modify it in place."""
    memo = _FOLDED.get()
    with onloaded(adapter.unembed()), onloaded(adapter.final_norm()):
        weight = adapter.unembed().weight  # [d_vocab, d_model]
        sources = (weight, *adapter.final_norm().parameters())  # what the fold is made from (a gain may be 1 + w)
        key = tuple((id(t), t._version, str(t.device)) for t in sources)
        if memo is not None and key in memo:
            return memo[key][1]
        w_u = weight.detach().double()  # [d_vocab, d_model]
        gain = adapter.final_norm_gain()
        if gain is not None:
            w_u = w_u * gain.detach().double()  # [d_vocab, d_model]
    if memo is not None:
        memo[key] = (sources, w_u.T)
    return w_u.T


def value_change(adapter, layer: int, resid: torch.Tensor) -> torch.Tensor:
    """v(x) - v(0) of residual vectors resid [..., d_model] as layer `layer`'s key/value heads read
    them (input norm, then the value projection; a value bias and a norm bias drop out):
    [..., kv_head, d_head], in the model's dtype."""
    block = adapter.layer(layer)
    norm = get_module(block, adapter.sites.input_norm)
    with onloaded(norm), onloaded(get_module(block, adapter.sites.v.projection)):  # offloaded by accelerate
        w_v = adapter.qkv_weights(layer)[2][0]  # [kv_head * d_head, d_model]
        resid = resid.to(w_v.device)
        zero = norm(torch.zeros(1, resid.shape[-1], dtype=resid.dtype, device=resid.device))  # [1, d_model]
        change = (norm(resid) - zero) @ w_v.T  # [..., kv_head * d_head]
    return change.view(*resid.shape[:-1], adapter.n_kv_heads, adapter.d_head)  # [..., kv_head, d_head]


def _token_values(adapter, layer: int) -> torch.Tensor:
    """value_change of every token embedding x (the embedding module's output: Gemma 3 scales the
    table by sqrt(d_model) there), no position: [d_vocab, kv_head, d_head] (float64)."""
    module = adapter.embed()
    n_vocab, device = module.weight.shape[0], module.weight.device
    parts = [
        value_change(adapter, layer, module(torch.arange(start, min(start + CHUNK, n_vocab), device=device)))
        for start in range(0, n_vocab, CHUNK)
    ]  # [chunk, kv_head, d_head] each
    return torch.cat(parts).double()


def sign_disagreements(frame) -> list[str]:
    """Heads ("L.H") whose weight-based and data-based copying scores have opposite signs."""
    rows = frame[(frame["ov_copying_score"] * frame["copying_score"]) < 0]
    return [f"{r.layer}.{r.head}" for r in rows.itertuples()]
