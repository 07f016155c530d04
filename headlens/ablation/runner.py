"""Running a model one decoder layer at a time, with z exposed (the fast sweep's substrate).

The same modules and the same attention as `model(...)`, reached through the architecture
adapter (headlens.arch): embedding, each layer (input norm -> attention -> output projection,
then the MLP, sequential or parallel residual as the family has it), final norm and unembedding,
with the causal + padding mask built by transformers' own mask functions, so a split run
reproduces the full forward pass.
"""

from __future__ import annotations

import torch

from headlens.ablation.unembed import unembed_losses
from headlens.arch import adapter_for


class LayerRunner:
    """One right-padded batch, run layer by layer (no grad unless the caller enables it)."""

    def __init__(self, model, input_ids: torch.Tensor, mask: torch.Tensor):
        self.model = model
        self.adapter = adapter_for(model)
        self.ctx = self.adapter.context(input_ids, mask)
        self.input_ids = self.ctx.input_ids  # [batch, pos] on the model's device
        self.n_layers = self.adapter.n_layers

    def embed(self) -> torch.Tensor:
        """Residual stream entering layer 0: [batch, pos, d_model]."""
        return self.adapter.embed_tokens(self.ctx)

    def attention(self, layer: int, resid: torch.Tensor, copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """z [batch, pos, head, d_head] and the attention output [batch, pos, d_model] of a layer."""
        return self.adapter.attention(layer, resid, self.ctx, copies)

    def finish_block(self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual leaving `layer`, from the residual entering it and its attention output."""
        return self.adapter.finish_block(layer, resid, attn_out)

    def block(self, layer: int, resid: torch.Tensor, copies: int = 1) -> torch.Tensor:
        _, out = self.attention(layer, resid, copies)
        return self.finish_block(layer, resid, out)

    def run_from(self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """Final residual from layer `layer`'s input and (edited) attention output: its MLP, then later layers."""
        resid = self.finish_block(layer, resid, attn_out)
        for later in range(layer + 1, self.n_layers):
            resid = self.block(later, resid, copies)
        return resid  # [copies * batch, pos, d_model]

    def seq_losses(self, resid: torch.Tensor, counted: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """Per-sequence sums of counted next-token losses from the final residual: [copies, batch].

        Only counted positions go through the final norm and the unembedding (both act per
        position, so this is exact): the repeat metric counts under half of them.
        """
        keep = counted.to(resid.device)  # [batch, pos-1]
        rows, pos = torch.nonzero(keep, as_tuple=True)  # counted (sequence, position) pairs
        picked = resid.view(copies, -1, *resid.shape[1:])[:, rows, pos]  # [copies, n_counted, d_model]
        targets = self.input_ids[rows, pos + 1]  # [n_counted]
        hidden = self.adapter.final_norm()(picked)  # [copies, n_counted, d_model]
        losses = unembed_losses(hidden, self.adapter.unembed(), targets)  # [copies, n_counted]
        sums = torch.zeros(copies, keep.shape[0], dtype=losses.dtype, device=losses.device)  # [copies, batch]
        return sums.index_add_(1, rows, losses)
