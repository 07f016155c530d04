"""Ablation of heads at the right site: z, the input of the output projection.

Zeroing a slice of the attention module's *output* mixes heads (nnsight #525, ACDC PR #82);
a head's own output is z = the input of GPT-2's `attn.c_proj` (TransformerLens `hook_z`).
The shared output bias b_O stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from headlens.heads import Head


@contextlib.contextmanager
def ablation_hooks(model, heads: Sequence[Head], replacement: dict[Head, torch.Tensor] | None = None):
    """Within the block, each head's z is replaced: by 0 (zero ablation), or by
    `replacement[head]` (a tensor broadcastable to [batch, pos, d_head]: mean or resampled z).

    Hooks are removed on exit, error included.
    """
    by_layer: dict[int, list[Head]] = {}
    for head in heads:
        by_layer.setdefault(head.layer, []).append(head)
    handles = []

    def make_hook(layer_heads: list[Head], n_heads: int):
        def hook(module, args):
            merged = args[0]  # [batch, pos, head * d_head]
            z = merged.view(*merged.shape[:-1], n_heads, -1).clone()  # [batch, pos, head, d_head]
            for head in layer_heads:
                if replacement is not None and head in replacement:
                    z[:, :, head.head] = replacement[head].to(z.dtype)
                else:
                    z[:, :, head.head] = 0.0
            return (z.view(merged.shape), *args[1:])

        return hook

    try:
        for layer, layer_heads in by_layer.items():
            attn = model.transformer.h[layer].attn
            handles.append(attn.c_proj.register_forward_pre_hook(make_hook(layer_heads, attn.num_heads)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def token_losses(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position: [batch, pos - 1], NaN where the target is padding.

    logits [batch, pos, d_vocab]; position t predicts token t + 1.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, pos-1, d_vocab]
    loss = -logp.gather(-1, input_ids[:, 1:, None])[..., 0]  # [batch, pos-1]
    valid = mask[:, 1:] & mask[:, :-1]
    return loss.masked_fill(~valid, float("nan"))
