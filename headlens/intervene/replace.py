"""What an ablated head's z becomes, and the hooks that put it there.

A head's own output is z, the input of the output projection (GPT-2 `attn.c_proj`, Llama `o_proj`,
GPT-NeoX `dense`; TransformerLens `hook_z`), reached through the architecture adapter's `hook_z`:
zeroing a slice of the attention module's *output* would mix heads (nnsight #525, ACDC PR #82).
The shared output bias b_O stays.
- `replacements`: per layer, what z becomes: zero, the mean over a reference set, or a resampled z;
- `z_change`: z' - z, the change every linear shortcut adds (the sweep, attribution, AtP*, GradDrop);
- `ablation_hooks`: the heads' z replaced within a block; `z_edit_hooks`: every layer's z edited by
  a function (gates, gradient probes), the weights frozen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from headlens.arch import adapter_for
from headlens.arch.kernels import no_pattern_kernels
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.intervene.evalset import cut_padding, row_batches

Replacement = torch.Tensor | None  # per layer: [n_seq, pos, head, d_head], [1, 1, head, d_head] or None (zero)


def capture_z(
    model,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    batch_size: int | None,
    on_z: Callable[[int, slice, torch.Tensor], None],
) -> None:
    """Run a set of sequences layer by layer; call on_z(layer, rows, z [batch, width, head, d_head]),
    width the batch's own (cut_padding)."""
    adapter = adapter_for(model)
    with torch.no_grad(), no_pattern_kernels(model):
        for rows in row_batches(mask, batch_size):
            ctx = adapter.context(*cut_padding(input_ids[rows], mask[rows]))
            resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
            for layer in range(adapter.n_layers):
                z, out = adapter.attention(layer, resid, ctx)  # [batch, pos, head, d_head], [batch, pos, d_model]
                on_z(layer, rows, z)
                resid = adapter.finish_block(layer, resid, out)


def _reference(evalset) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Reference ids and mask, and whether they are the evaluation set itself."""
    if evalset.reference_ids is None:
        return evalset.input_ids, evalset.mask, True
    return evalset.reference_ids, evalset.reference_mask, False


def replacements(model, evalset, method: str, seed: int, batch_size: int | None) -> list[Replacement]:
    """What z_h becomes under `method`, per layer, for the evaluation sequences.

    zero -> None. mean -> the mean of z over every real position of the reference set,
    [1, 1, head, d_head] (mean ablation, Wang et al. 2022, taken over positions as well).
    resample -> for each evaluation position, z at a reference position drawn uniformly (seeded),
    [n_seq, pos, head, d_head]: from another sequence when the reference is the evaluation set
    itself and holds several, else from another position (resample ablation, Chan et al. 2022).
    """
    n_layers = adapter_for(model).n_layers
    if method == "zero":
        return [None] * n_layers
    ref_ids, ref_mask, same = _reference(evalset)
    if method == "mean":
        sums: list = [0.0] * n_layers

        def add(layer: int, rows: slice, z: torch.Tensor) -> None:
            keep = ref_mask[rows, : z.shape[1]].to(z.device)  # [batch, pos]
            sums[layer] = sums[layer] + z[keep].double().sum(0)  # [head, d_head]

        capture_z(model, ref_ids, ref_mask, batch_size, add)
        n = int(ref_mask.sum())
        return [(total / n).float()[None, None] for total in sums]  # [1, 1, head, d_head] per layer
    src_seq, src_pos = _resample_sources(evalset.mask, ref_mask, same, seed)  # [n_seq, pos] each
    out: list = [None] * n_layers
    needed = torch.unique(src_seq)

    def gather(layer: int, rows: slice, z: torch.Tensor) -> None:
        if out[layer] is None:
            out[layer] = torch.zeros(*evalset.mask.shape, *z.shape[2:], dtype=z.dtype, device=z.device)
        for seq in needed[(needed >= rows.start) & (needed < rows.stop)].tolist():
            at = src_seq == seq  # [n_seq, pos]
            out[layer][at] = z[seq - rows.start][src_pos[at].to(z.device)]

    capture_z(model, ref_ids, ref_mask, batch_size, gather)
    return out


def _resample_sources(
    mask: torch.Tensor, ref_mask: torch.Tensor, same: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every evaluation position, the reference (sequence, position) it takes z from: two
    [n_seq, pos] long tensors; padding positions get source (0, 0), which they never read."""
    gen = torch.Generator().manual_seed(seed)
    ref_seq, ref_pos = torch.nonzero(ref_mask, as_tuple=True)  # [n_ref_positions]
    eval_seq, eval_pos = torch.nonzero(mask, as_tuple=True)  # [n_eval_positions]
    by_seq = same and int(ref_mask.shape[0]) > 1
    if len(ref_seq) < 2:
        raise ConfigError("resample ablation needs at least 2 reference positions")
    pick = torch.randint(0, len(ref_seq), (len(eval_seq),), generator=gen)  # [n_eval_positions]
    for _ in range(1000):  # redraw collisions with the position itself (or its own sequence)
        bad = ref_seq[pick] == eval_seq if by_seq else (ref_seq[pick] == eval_seq) & (ref_pos[pick] == eval_pos)
        if not same or not bool(bad.any()):
            break
        pick[bad] = torch.randint(0, len(ref_seq), (int(bad.sum()),), generator=gen)
    src_seq = torch.zeros(mask.shape, dtype=torch.long)  # [n_seq, pos]
    src_pos = torch.zeros(mask.shape, dtype=torch.long)  # [n_seq, pos]
    src_seq[eval_seq, eval_pos] = ref_seq[pick]
    src_pos[eval_seq, eval_pos] = ref_pos[pick]
    return src_seq, src_pos


def layer_replacement(rep: Replacement, rows: slice, width: int | None = None) -> Replacement:
    """The replacement of a layer for a slice of evaluation sequences, its positions cut to `width`
    (the batch's, EvalSet.batch) when it has a position axis."""
    if rep is None or rep.shape[0] == 1:
        return rep
    return rep[rows, :width]


def heads_by_layer(heads: Sequence) -> dict[int, list]:
    by_layer: dict[int, list] = {}
    for head in heads:
        by_layer.setdefault(head.layer, []).append(head)
    return by_layer


def z_change(z: torch.Tensor, rep: Replacement) -> torch.Tensor:
    """z' - z: the replacement (0 for None) minus z, in z's shape and dtype; z [batch, pos, head, d_head]
    (or one head's [batch, pos, d_head] with its slice of the replacement)."""
    return -z if rep is None else rep.to(z.dtype).expand_as(z) - z


@contextlib.contextmanager
def ablation_hooks(model, heads: Sequence[Head], replacement: dict[Head, torch.Tensor] | None = None):
    """Within the block, each head's z is replaced: by 0 (zero ablation), or by
    `replacement[head]` (a tensor broadcastable to [batch, pos, d_head]: mean or resampled z).

    Hooks are removed on exit, error included (headlens.arch.hooks).
    """

    def make_edit(layer_heads: list[Head]):
        def edit(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()  # [batch, pos, head, d_head]
            for head in layer_heads:
                if replacement is not None and head in replacement:
                    z[:, :, head.head] = replacement[head].to(z.dtype)
                else:
                    z[:, :, head.head] = 0.0
            return z

        return edit

    with adapter_for(model).hooks() as hooks:
        for layer, layer_heads in heads_by_layer(heads).items():
            hooks.z(layer, make_edit(layer_heads))
        yield


@contextlib.contextmanager
def z_edit_hooks(model, edit: Callable[[int, torch.Tensor], torch.Tensor]):
    """Within the block, layer L's z becomes edit(L, z), z: [batch, pos, head, d_head];
    weights are frozen (requires_grad False) and restored on exit, error included."""
    adapter = adapter_for(model)
    with adapter.hooks() as hooks:
        hooks.enter(frozen_weights(model))
        for layer in range(adapter.n_layers):
            hooks.z(layer, lambda z, layer=layer: edit(layer, z))
        yield


@contextlib.contextmanager
def frozen_weights(model):
    """Within the block, the model's trainable parameters have requires_grad False; restored on exit."""
    frozen = [param for param in model.parameters() if param.requires_grad]
    for param in frozen:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param in frozen:
            param.requires_grad_(True)
