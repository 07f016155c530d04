"""Running a model one decoder layer at a time, with z exposed (the fast sweep's substrate).

The same modules and the same attention as `model(...)`, reached through the architecture
adapter (headlens.arch): embedding, each layer (input norm -> attention -> output projection,
then the MLP, sequential or parallel residual as the family has it), final norm and unembedding,
with the causal + padding mask built by transformers' own mask functions, so a split run
reproduces the full forward pass.
"""

from __future__ import annotations

import torch

from headlens.ablation.metrics import position_values
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

    def unit_sums(self, resid: torch.Tensor, evalset, rows: slice, copies: int = 1) -> torch.Tensor:
        """Sums of the metric's values over each bootstrap unit from the final residual of
        `copies` stacked copies of the batch `rows` of `evalset`: [copies, n_units].

        Only scored positions go through the final norm and the unembedding (both act per
        position, so this is exact): the repeat metric scores under half of them.
        """
        keep = evalset.counted[rows].to(resid.device)  # [batch, pos-1]
        seq, pos = torch.nonzero(keep, as_tuple=True)  # scored (sequence, position) pairs
        picked = resid.view(copies, -1, *resid.shape[1:])[:, seq, pos]  # [copies, n_scored, d_model]
        hidden = self.adapter.final_norm()(picked)  # [copies, n_scored, d_model]
        values = scored_values(hidden, self.adapter.unembed(), evalset, rows, seq, pos)  # [copies, n_scored]
        units = evalset.units[rows].to(resid.device)[seq, pos]  # [n_scored]
        sums = torch.zeros(copies, evalset.n_units, dtype=values.dtype, device=values.device)  # [copies, n_units]
        return sums.index_add_(1, units, values)


def scored_values(hidden: torch.Tensor, lm_head, evalset, rows: slice, seq: torch.Tensor,
                  pos: torch.Tensor) -> torch.Tensor:
    """The metric's value at scored pairs (seq, pos) of the batch `rows`: [..., n_scored];
    hidden [..., n_scored, d_model] after the final norm. The target is token pos + 1."""
    device = hidden.device
    targets = evalset.input_ids[rows].to(device)[seq, pos + 1]  # [n_scored]
    foils = None if evalset.foils is None else evalset.foils[rows].to(device)[seq, pos]  # [n_scored]
    return position_values(hidden, lm_head, targets, foils, evalset.kind)
