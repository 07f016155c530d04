"""The TransformerLens peer of the exact sweep, shared by the benchmarks that time it: one full
`run_with_hooks(return_type="loss")` per head, zeroing that head's `hook_z`."""

from __future__ import annotations

import torch


def zero_ablation_deltas(bridge, tokens: torch.Tensor, layers, n_heads: int) -> list[float]:
    """Loss change of zeroing each head of `layers` alone, in (layer, head) order, on tokens [n_seq, pos]."""
    deltas = []
    with torch.no_grad():
        base = bridge(tokens, return_type="loss").item()
        for layer in layers:
            for head in range(n_heads):

                def zero_head(z, hook, head=head):
                    z[:, :, head] = 0.0  # hook_z [batch, pos, head, d_head]
                    return z

                loss = bridge.run_with_hooks(
                    tokens, return_type="loss", fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)]
                )
                deltas.append(loss.item() - base)
    return deltas
