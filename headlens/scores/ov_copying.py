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
W_U (W_E W_V) is made once per key/value head and shared by the query heads that read it, so
the cost per layer is one pass of the vocabulary through the value projection and one
[d_model, d_vocab] @ [d_vocab, d_head] product per key/value head.
"""

from __future__ import annotations

import torch

from headlens.arch import adapter_for, get_module
from headlens.devices import onloaded

CHUNK = 4096  # vocabulary rows per pass through a layer's attention


def ov_copying_scores(model) -> torch.Tensor:
    """sum(eig) / sum(|eig|) of every head's full OV circuit: [n_layers, n_heads] (float64)."""
    adapter = adapter_for(model)
    out = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.float64)  # [layer, head]
    w_u = folded_unembed(adapter)  # [d_model, d_vocab]
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
            through = [w_u @ values[:, group] for group in range(adapter.n_kv_heads)]  # [d_model, d_head] each
            for head in range(adapter.n_heads):
                small = w_o[head] @ through[adapter.kv_group(head)]  # [d_head, d_head]
                eig = torch.linalg.eigvals(small)  # [d_head] complex
                total = float(eig.abs().sum())
                out[layer, head] = float(eig.sum().real) / total if total > 0 else 0.0
    return out


def folded_unembed(adapter) -> torch.Tensor:
    """The unembedding with the final norm's gain folded in: [d_model, d_vocab] (float64)."""
    with onloaded(adapter.unembed()), onloaded(adapter.final_norm()):
        w_u = adapter.unembed().weight.detach().double()  # [d_vocab, d_model]
        gain = adapter.final_norm_gain()
        if gain is not None:
            w_u = w_u * gain.detach().double()  # [d_vocab, d_model]
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
