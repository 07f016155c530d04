"""Copying read from the weights: the OV circuit's eigenvalues (Elhage et al. 2021).

"A Mathematical Framework for Transformer Circuits" (transformer-circuits.pub, 2021): a head's
full OV circuit W_E W_V^h W_O^h W_U maps a token attended to onto the logits it writes. A copying
head raises the attended token itself, which shows as mostly positive eigenvalues; a suppressing
head (copy suppression, McDougall et al. 2023) as mostly negative ones. Score:
  ov_copying_score(h) = sum(lambda) / sum(|lambda|)  in [-1, 1]   (lambda complex; sum(lambda) is real).
Here:
- W_E is the token embedding passed through the head's own layer's input norm, the norm's bias
  removed (for layer 0, the first layer norm folded in as Elhage et al. do); W_V^h is read as
  the change of the head's value v(x) - v(0) through the adapter's `hook_qkv`, so any family's
  projections (and grouped key/value heads) are used as the model uses them;
- W_U is the unembedding with the final norm's gain folded in (and, for LayerNorm, its centring
  folded into W_O; for Gemma 3, the gain of the norm on the attention output folded into W_O);
  biases are dropped: eigenvalues are a property of the linear map.
The nonzero eigenvalues of (W_E W_V)(W_O W_U), a [d_vocab, d_vocab] matrix of rank d_head, equal
those of (W_O W_U)(W_E W_V), [d_head, d_head]: the score costs two thin matmuls per head, even at
GPT-2's 50,257 tokens.
"""

from __future__ import annotations

import torch

from headlens.arch import adapter_for
from headlens.devices import onloaded

CHUNK = 4096  # vocabulary rows per pass through a layer's attention


def ov_copying_scores(model) -> torch.Tensor:
    """sum(eig) / sum(|eig|) of every head's full OV circuit: [n_layers, n_heads] (float64)."""
    adapter = adapter_for(model)
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    w_u = _folded_unembed(adapter)  # [d_model, d_vocab]
    with torch.no_grad():
        for layer in range(adapter.n_layers):
            values = _token_values(adapter, layer)  # [d_vocab, kv_head, d_head]
            with onloaded(adapter.z_module(layer)):  # W_O of a layer accelerate offloaded, copied
                w_o = adapter.w_o(layer).double()  # [head, d_head, d_model]
            gain = adapter.attn_out_gain(layer)  # a norm on the attention output (Gemma): its gain is on the path
            if gain is not None:
                w_o = w_o * gain.detach().double()  # [head, d_head, d_model]
            if isinstance(adapter.final_norm(), torch.nn.LayerNorm):
                w_o = w_o - w_o.mean(-1, keepdim=True)  # LayerNorm's centring, folded in
            for head in range(adapter.n_heads):
                left = w_o[head] @ w_u  # [d_head, d_vocab]
                small = left @ values[:, adapter.kv_group(head)]  # [d_head, d_head]
                eig = torch.linalg.eigvals(small)  # [d_head] complex
                total = float(eig.abs().sum())
                out[layer, head] = float(eig.sum().real) / total if total > 0 else 0.0
    return out


def _folded_unembed(adapter) -> torch.Tensor:
    """The unembedding with the final norm's gain folded in: [d_model, d_vocab] (float64)."""
    with onloaded(adapter.unembed()), onloaded(adapter.final_norm()):
        w_u = adapter.unembed().weight.detach().double()  # [d_vocab, d_model]
        gain = adapter.final_norm_gain()
        if gain is not None:
            w_u = w_u * gain.detach().double()  # [d_vocab, d_model]
    return w_u.T


def _token_values(adapter, layer: int) -> torch.Tensor:
    """v(x) - v(0) of every token embedding x as layer `layer`'s heads read it (input norm
    applied, no position): [d_vocab, kv_head, d_head] (float64). x is the embedding module's
    output (Gemma 3 scales the table by sqrt(d_model) there)."""
    module = adapter.embed()
    weight = module.weight  # [d_vocab, d_model]
    zero = torch.zeros(1, 1, weight.shape[1], dtype=weight.dtype, device=weight.device)  # [1, 1, d_model]
    v0 = _values(adapter, layer, zero)  # [1, 1, kv_head, d_head]
    parts = [(_values(adapter, layer, module(torch.arange(start, min(start + CHUNK, weight.shape[0]),
                                                          device=weight.device)[:, None]).detach()) - v0)[:, 0]
             for start in range(0, weight.shape[0], CHUNK)]  # [chunk, kv_head, d_head] each
    return torch.cat(parts).double()


def _values(adapter, layer: int, resid: torch.Tensor) -> torch.Tensor:
    """Values of length-1 sequences resid [n, 1, d_model] through the layer's input norm and
    attention: [n, 1, kv_head, d_head]."""
    n = resid.shape[0]
    ids = torch.zeros(n, 1, dtype=torch.long)  # [n, 1] (positions only; the tokens come from resid)
    ctx = adapter.context(ids, torch.ones(n, 1, dtype=torch.bool))
    seen = []
    with adapter.hooks() as hooks:
        hooks.qkv(layer, lambda q, k, v: seen.append(v.detach()))
        adapter.attention(layer, resid, ctx)
    return seen[0].transpose(1, 2)  # [n, 1, kv_head, d_head]


def sign_disagreements(frame) -> list[str]:
    """Heads ("L.H") whose weight-based and data-based copying scores have opposite signs."""
    rows = frame[(frame["ov_copying_score"] * frame["copying_score"]) < 0]
    return [f"{r.layer}.{r.head}" for r in rows.itertuples()]
