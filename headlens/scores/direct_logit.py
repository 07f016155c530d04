"""Direct logit attribution: what each head writes straight into a logit difference at one position.

A head's output z_h W_O^h enters the residual stream and reaches the logits through the final norm
and the unembedding. With the norms' scales frozen at their values in the clean run (the usual
linearisation: Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; Wang et al.
2022, arXiv 2211.00593, measure name movers by this direct path), that path is linear, so the
heads' direct effects add up with the other components' to the logit difference itself:

    direct_h = (c(g_a * z_h W_O^h / s_a) / s_f) . (W_U[target] - W_U[foil]) * g_f

where g_f and s_f are the final norm's gain and scale at that position, c() its centring (LayerNorm
only), and g_a, s_a a norm on the attention output where the family has one (Gemma 3's
post-attention norm; 1 elsewhere). A norm's scale is read from the norm itself (`norm_factor`), so
no epsilon is restated here. A positive direct effect raises the target over the foil.
"""

from __future__ import annotations

import torch

from headlens.load.devices import onloaded


def norm_factor(norm, gain: torch.Tensor | None, centres: bool, x: torch.Tensor) -> torch.Tensor:
    """1 / s of a norm at each row of its input x [n, d_model]: norm(x) = bias + gain * c(x) / s.
    The least-squares fit of that one number per row, exact for LayerNorm and RMSNorm: [n, 1] (float64)."""
    with onloaded(norm):  # offloaded by accelerate: its weights are real only here (its forward re-offloads them)
        bias = getattr(norm, "bias", None)
        bias = None if bias is None else bias.detach().double().clone()  # [d_model]
    with torch.no_grad():
        y = norm(x).double()  # [n, d_model]
    if bias is not None:
        y = y - bias.to(y.device)
    u = x.double()
    if centres:
        u = u - u.mean(-1, keepdim=True)
    if gain is not None:
        u = u * gain.to(u.device)
    return (y * u).sum(-1, keepdim=True) / (u * u).sum(-1, keepdim=True)  # [n, 1]


def readout(adapter, final_in: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """What a residual-stream vector written at each position is worth along `direction`, the final
    norm's gain and its scale in this run folded in: [n, d_model] (float64), from final_in [n, d_model]
    (the final norm's input) and direction [n, d_model] (an unembedding difference). For a vector x
    written there, its direct effect is (c(x) * readout).sum(-1), c() the final norm's centring (`centre`)."""
    final = adapter.final_norm()
    with onloaded(final):
        gain = adapter.final_norm_gain()
        gain = None if gain is None else gain.detach().double().to(direction.device)  # [d_model]
    if gain is not None:
        direction = direction.double() * gain  # the final norm's gain folded in
    inv_final = norm_factor(final, gain, adapter.final_norm_centres, final_in)  # [n, 1]
    return direction.double().to(inv_final.device) * inv_final  # [n, d_model]


def centre(adapter, x: torch.Tensor) -> torch.Tensor:
    """x [..., d_model] as the final norm sees it: mean-centred for a LayerNorm, unchanged for an RMSNorm."""
    return x - x.mean(-1, keepdim=True) if adapter.final_norm_centres else x


def heads_written(adapter, layer: int, z_layer: torch.Tensor, attn_out: torch.Tensor | None) -> torch.Tensor:
    """What each head of `layer` adds to the residual stream: [n, head, d_model] (float64), from its z
    [n, head, d_head] through its slice of W_O and, where the family has one, the norm on the attention
    output with its scale frozen at attn_out [n, d_model] (that norm's input in this run)."""
    with onloaded(adapter.z_module(layer)):  # offloaded by accelerate
        w_o = adapter.w_o(layer).detach().double().to(z_layer.device)  # [head, d_head, d_model]
    written = torch.einsum("nhd,hdm->nhm", z_layer.double(), w_o)  # [n, head, d_model]
    return written * attn_out_scale(adapter, layer, attn_out)[:, None, :]  # [n, head, d_model]


def attn_out_scale(adapter, layer: int, attn_out: torch.Tensor | None) -> torch.Tensor:
    """The frozen factor of the norm on `layer`'s attention output, gain / s: [n, d_model] (float64), or
    ones [1, 1] where the family has no such norm (or attn_out is None)."""
    norm = adapter.attn_out_norm_module(layer)
    if norm is None or attn_out is None:
        return torch.ones(1, 1, dtype=torch.float64)
    with onloaded(norm):
        gain = adapter.attn_out_gain(layer).detach().double()  # [d_model]
    inv = norm_factor(norm, gain, False, attn_out)  # [n, 1]
    return gain.to(inv.device) * inv  # [n, d_model]


def head_direct_effects(
    adapter,
    z: list[torch.Tensor],
    attn_out: list[torch.Tensor] | None,
    final_in: torch.Tensor,
    target: torch.Tensor,
    foil: torch.Tensor | None,
) -> torch.Tensor:
    """Each head's direct effect on logit(target) - logit(foil), or on logit(target) alone when `foil`
    is None: [n_layers, n, n_heads] (float64).

    z: per layer z at the scored positions [n, head, d_head]; attn_out: per layer the attention
    output there [n, d_model] (the input of a norm on it; None when the family has none);
    final_in: the final norm's input there [n, d_model]; target, foil: [n] token ids."""
    unembed = adapter.unembed()
    with onloaded(unembed):  # only the two unembedding rows per position are read
        w_u = unembed.weight.detach()  # [d_vocab, d_model]
        direction = w_u[target.to(w_u.device)].double()  # [n, d_model]
        if foil is not None:
            direction = direction - w_u[foil.to(w_u.device)].double()  # [n, d_model]
    along = readout(adapter, final_in, direction)  # [n, d_model]
    out = []
    for layer, z_layer in enumerate(z):
        written = heads_written(adapter, layer, z_layer, None if attn_out is None else attn_out[layer])
        written = centre(adapter, written)  # [n, head, d_model]
        out.append(torch.einsum("nhm,nm->nh", written, along.to(written.device)))  # [n, head]
    return torch.stack(out)  # [layer, n, head]
