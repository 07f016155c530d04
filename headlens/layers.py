"""Running a Hugging Face GPT-2 one block at a time, with z exposed (the fast sweep's substrate).

The same modules and the same eager attention as `model(...)`: `transformer.wte/wpe`, each
`transformer.h[L]` (ln_1 -> attn -> c_proj -> + residual -> ln_2 -> mlp -> + residual),
`ln_f`, `lm_head`, with the causal + padding mask built by transformers' own
`create_causal_mask`, so a split run reproduces the full forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlens.unembed import unembed_losses

Replacement = torch.Tensor | None  # per layer: [n_seq | 1, pos, head, d_head] or None (zero)


class LayerRunner:
    """One right-padded batch, run block by block (no grad unless the caller enables it)."""

    def __init__(self, model, input_ids: torch.Tensor, mask: torch.Tensor):
        from transformers.masking_utils import create_causal_mask

        self.model = model
        self.tf = model.transformer
        device = next(model.parameters()).device
        self.input_ids = input_ids.to(device)  # [batch, pos]
        self.mask = mask.to(device)  # [batch, pos] bool
        n_pos = input_ids.shape[1]
        self.position_ids = torch.arange(n_pos, device=device)[None]  # [1, pos]
        embeds = self.tf.wte(self.input_ids)  # [batch, pos, d_model]
        self.causal_mask = create_causal_mask(
            config=self.tf.config, inputs_embeds=embeds, attention_mask=self.mask.long(),
            cache=None, position_ids=self.position_ids)  # [batch, 1, q_pos, k_pos] additive, or None
        self._embeds = embeds

    def embed(self) -> torch.Tensor:
        """Residual stream entering layer 0: [batch, pos, d_model]."""
        return self.tf.drop(self._embeds + self.tf.wpe(self.position_ids))

    def mask_for(self, copies: int):
        if self.causal_mask is None or copies == 1:
            return self.causal_mask
        return self.causal_mask.repeat(copies, 1, 1, 1)  # [copies * batch, 1, q_pos, k_pos]

    def attention(self, layer: int, resid: torch.Tensor, copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """z [batch, pos, head, d_head] and the attention output [batch, pos, d_model] of a layer."""
        attn = self.tf.h[layer].attn
        seen: list[torch.Tensor] = []

        def grab(module, args):
            seen.append(args[0])  # [batch, pos, head * d_head]

        handle = attn.c_proj.register_forward_pre_hook(grab)
        try:
            out, _ = attn(self.tf.h[layer].ln_1(resid), attention_mask=self.mask_for(copies))
        finally:
            handle.remove()
        z = seen[0].view(*seen[0].shape[:-1], attn.num_heads, attn.head_dim)  # [batch, pos, head, d_head]
        return z, out

    def finish_block(self, layer: int, resid_mid: torch.Tensor) -> torch.Tensor:
        """Residual after the MLP of `layer`, given the residual after its attention."""
        block = self.tf.h[layer]
        return resid_mid + block.mlp(block.ln_2(resid_mid))  # [batch, pos, d_model]

    def block(self, layer: int, resid: torch.Tensor, copies: int = 1) -> torch.Tensor:
        _, out = self.attention(layer, resid, copies)
        return self.finish_block(layer, resid + out)

    def run_from(self, layer: int, resid_mid: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """Final residual from the residual after layer `layer`'s attention: its MLP, then later blocks."""
        resid = self.finish_block(layer, resid_mid)
        for later in range(layer + 1, len(self.tf.h)):
            resid = self.block(later, resid, copies)
        return resid  # [copies * batch, pos, d_model]

    def seq_losses(self, resid: torch.Tensor, counted: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """Per-sequence sums of counted next-token losses from the final residual: [copies, batch].

        Only counted positions go through ln_f and the unembedding (both act per position, so
        this is exact): the repeat metric counts under half of them.
        """
        keep = counted.to(resid.device)  # [batch, pos-1]
        rows, pos = torch.nonzero(keep, as_tuple=True)  # counted (sequence, position) pairs
        picked = resid.view(copies, -1, *resid.shape[1:])[:, rows, pos]  # [copies, n_counted, d_model]
        targets = self.input_ids[rows, pos + 1]  # [n_counted]
        losses = unembed_losses(self.tf.ln_f(picked), self.model.lm_head, targets)  # [copies, n_counted]
        sums = torch.zeros(copies, keep.shape[0], dtype=losses.dtype, device=losses.device)  # [copies, batch]
        return sums.index_add_(1, rows, losses)


def head_out_weight(model, layer: int, head: int) -> torch.Tensor:
    """Rows of c_proj (Conv1D, weight [in, out]) that map head h's z: [d_head, d_model]."""
    attn = model.transformer.h[layer].attn
    d_head = attn.head_dim
    return attn.c_proj.weight[head * d_head:(head + 1) * d_head]  # [d_head, d_model]


def capture_z(model, input_ids: torch.Tensor, mask: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """z of every layer over a set of sequences: list over layers of [n_seq, pos, head, d_head]."""
    per_layer: list[list[torch.Tensor]] = [[] for _ in model.transformer.h]
    with torch.no_grad():
        for start in range(0, input_ids.shape[0], batch_size):
            runner = LayerRunner(model, input_ids[start:start + batch_size], mask[start:start + batch_size])
            resid = runner.embed()
            for layer in range(len(per_layer)):
                z, out = runner.attention(layer, resid)
                per_layer[layer].append(z.clone())
                resid = runner.finish_block(layer, resid + out)
    return [torch.cat(chunks) for chunks in per_layer]


def replacements(model, evalset, method: str, seed: int, batch_size: int) -> list[Replacement]:
    """What z_h becomes under `method`, per layer, for the evaluation sequences.

    zero -> None. mean -> the mean of z over the reference set at each position (Wang et al.
    2022, mean ablation), [1, pos, head, d_head]; positions no reference sequence reaches take
    the mean over all reference positions. resample -> z of a reference sequence drawn (seeded)
    for each evaluation sequence among those at least as long, [n_seq, pos, head, d_head].
    """
    from headlens.errors import ConfigError, InputTextError

    n_layers = len(model.transformer.h)
    if method == "zero":
        return [None] * n_layers
    if evalset.reference_ids is None:
        raise InputTextError("the text gives a single window: mean and resample ablation need a second window "
                             "as the reference set (give a longer --text)")
    ref_z = capture_z(model, evalset.reference_ids, evalset.reference_mask, batch_size)
    n_pos = evalset.input_ids.shape[1]
    ref_mask = evalset.reference_mask.to(ref_z[0].device)
    if method == "mean":
        return [_mean_z(z, ref_mask, n_pos) for z in ref_z]
    lengths = evalset.mask.sum(1)  # [n_seq]
    ref_lengths = ref_mask.sum(1)  # [n_ref]
    gen = torch.Generator().manual_seed(seed)
    picks = []
    for length in lengths.tolist():
        ok = torch.nonzero(ref_lengths >= length)[:, 0]
        if ok.numel() == 0:
            raise ConfigError(f"resample ablation: no reference sequence has {length} tokens")
        picks.append(int(ok[torch.randint(0, ok.numel(), (1,), generator=gen)]))
    out = []
    for z in ref_z:
        z = z[torch.tensor(picks)][:, :n_pos]  # [n_seq, pos, head, d_head]
        if z.shape[1] < n_pos:
            z = torch.nn.functional.pad(z, (0, 0, 0, 0, 0, n_pos - z.shape[1]))
        out.append(z)
    return out


def _mean_z(z: torch.Tensor, ref_mask: torch.Tensor, n_pos: int) -> torch.Tensor:
    weights = ref_mask.to(z.dtype)[:, :, None, None]  # [n_ref, pos_ref, 1, 1]
    total = (z * weights).sum(0)  # [pos_ref, head, d_head]
    count = weights.sum(0)  # [pos_ref, 1, 1]
    overall = total.sum(0) / count.sum(0)  # [head, d_head]
    mean = torch.where(count > 0, total / count.clamp(min=1), overall)  # [pos_ref, head, d_head]
    if mean.shape[0] < n_pos:
        mean = torch.cat([mean, overall.expand(n_pos - mean.shape[0], *overall.shape)])
    return mean[None, :n_pos]  # [1, pos, head, d_head]


def layer_replacement(rep: Replacement, rows: slice) -> Replacement:
    """The replacement of a layer for a slice of evaluation sequences."""
    if rep is None or rep.shape[0] == 1:
        return rep
    return rep[rows]


def heads_by_layer(heads: Sequence) -> dict[int, list]:
    by_layer: dict[int, list] = {}
    for head in heads:
        by_layer.setdefault(head.layer, []).append(head)
    return by_layer
