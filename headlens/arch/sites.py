"""The site table: a mapping between headlens's abstract names of a layer's hook sites (q, k, v,
z, o, and the norms and modules around them) and one family's actual modules.

It is data, as pyvene's `modelings_intervenable_*.py` tables are
(`"head_key_output": ("layers[%s].self_attn.k_proj", OUTPUT_HOOK, (split_head_and_permute, "n_kv_head"))`):
each of q, k, v, z and o is a `Site` row naming its module (relative to a decoder layer), the
hook direction that sees it (the module's input or output) and the split rule that turns what
the hook sees into per-head tensors:
- HEADS: [batch, pos, heads * d_head], heads concatenated (Llama's q_proj, any o_proj input);
- NORMED: [batch, pos, heads, d_head], already per head, after a per-head norm (Qwen3's q_norm);
- FUSED: part `part` of `parts` equal blocks of the last dimension, each HEADS (GPT-2's c_attn,
  q | k | v);
- FUSED_HEADS: per head, `parts` blocks of d_head each (GPT-NeoX's query_key_value,
  [batch, pos, head, (q | k | v) x d_head]).
`heads` names the adapter property giving the row's head count ("n_kv_heads" for k and v).
A family's variant is derived from another's table with `dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

INPUT, OUTPUT = "input", "output"  # hook directions: a forward pre-hook or a forward hook
HEADS, NORMED, FUSED, FUSED_HEADS = "heads", "normed", "fused", "fused_heads"  # split rules
LINEAR, CONV1D = "linear", "conv1d"  # weight layouts: nn.Linear [out, in], GPT-2's Conv1D [in, out]


@dataclass(frozen=True)
class Split:
    """How a hooked tensor splits into heads (module docstring)."""

    kind: str = HEADS
    heads: str = "n_heads"  # the adapter property giving the number of heads of this row
    part: int = 0  # FUSED, FUSED_HEADS: which block (q 0, k 1, v 2)
    parts: int = 1  # FUSED, FUSED_HEADS: how many blocks


@dataclass(frozen=True)
class Site:
    """One row of the table: a module (relative to a decoder layer), the hook direction that sees
    the row's tensor, its split rule, and where its weights are."""

    module: str
    hook: str = OUTPUT
    split: Split = Split()
    weights: str | None = None  # the projection holding the row's weights, when `module` is a norm after it
    layout: str = LINEAR  # how the weights' module stores them

    @property
    def projection(self) -> str:
        """The module holding this row's weights."""
        return self.weights or self.module


@dataclass(frozen=True)
class Sites:
    """Module paths of one family, relative to the *LM* model unless said otherwise."""

    layers: str  # the list of decoder layers
    attn: str  # attention module, relative to a layer
    input_norm: str  # norm before attention, relative to a layer
    post_norm: str  # norm before the MLP, relative to a layer
    mlp: str  # relative to a layer
    q: Site  # queries as the rotary step receives them (after any q norm)
    k: Site  # keys, likewise
    v: Site  # values
    z: Site  # z: the input of the output projection
    o: Site  # the output projection's output (its weights are W_O)
    embed: str  # token embedding
    final_norm: str  # norm after the last layer
    unembed: str  # LM head
    trunk: str  # the base model without its LM head
    pos_embed: str | None = None  # learned absolute position embedding added to the tokens' (GPT-2), or None
    embed_dropout: str | None = None  # dropout on the embedded input (GPT-2), or None
    rotary_emb: str | None = None  # the base model's rotary module, computing (cos, sin), or None
    rotary: Callable | None = None  # the family's `apply_rotary_pos_emb(q, k, cos, sin)`, or None
    scale: Callable | None = None  # scale(config, layer) of Q K^T; None: the attention module's `scaling`
    parallel_residual: str | None = None  # config flag: attention and MLP both read the block's input
    scratch: Callable | None = None  # scratch(attn, config, layer): the family's own headlens.mha attention


def get_module(root: nn.Module, path: str) -> nn.Module:
    """`root.a.b[3].c` for path "a.b.3.c" (empty path: root)."""
    module = root
    for part in filter(None, path.split(".")):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def to_heads(tensor: torch.Tensor, split: Split, n_heads: int, d_head: int) -> torch.Tensor:
    """What a hook saw, [batch, pos, ...], as [batch, heads, pos, d_head] by the row's split rule."""
    if split.kind == NORMED:  # [batch, pos, heads, d_head]
        return tensor.transpose(1, 2)
    if split.kind == FUSED_HEADS:
        per_head = tensor.view(*tensor.shape[:-1], n_heads, split.parts * d_head)  # [batch, pos, head, parts * d_head]
        return per_head.transpose(1, 2).chunk(split.parts, dim=-1)[split.part]  # [batch, head, pos, d_head]
    if split.kind == FUSED:
        tensor = tensor.split(tensor.shape[-1] // split.parts, dim=-1)[split.part]  # [batch, pos, heads * d_head]
    return tensor.reshape(*tensor.shape[:-1], n_heads, d_head).transpose(1, 2)  # [batch, heads, pos, d_head]


def row_weights(
    module: torch.nn.Module, site: Site, n_heads: int, d_head: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The row's weight [heads * d_head, d_in] (nn.Linear's layout) and bias [heads * d_head] or None."""
    weight = module.weight.t() if site.layout == CONV1D else module.weight  # [out, d_in]
    bias, split = module.bias, site.split
    if split.kind == FUSED:
        size = weight.shape[0] // split.parts
        weight = weight[split.part * size : (split.part + 1) * size]  # [heads * d_head, d_in]
        bias = None if bias is None else bias[split.part * size : (split.part + 1) * size]
    elif split.kind == FUSED_HEADS:
        weight = weight.view(n_heads, split.parts, d_head, -1)[:, split.part].reshape(n_heads * d_head, -1)
        bias = None if bias is None else bias.view(n_heads, split.parts, d_head)[:, split.part].reshape(-1)
    return weight, bias


def splice_row(output: torch.Tensor, row: torch.Tensor, site: Site, n_heads: int, d_head: int) -> torch.Tensor:
    """The projection module's output [..., out] with the part that is `site`'s row replaced by
    `row` [..., heads * d_head] (heads concatenated, row_weights' layout): the inverse of reading
    the row out of a fused projection."""
    split = site.split
    if split.kind == FUSED:
        size = output.shape[-1] // split.parts
        return torch.cat([output[..., : split.part * size], row, output[..., (split.part + 1) * size :]], dim=-1)
    if split.kind == FUSED_HEADS:
        out = output.reshape(*output.shape[:-1], n_heads, split.parts, d_head).clone()  # [..., head, parts, d_head]
        out[..., split.part, :] = row.reshape(*row.shape[:-1], n_heads, d_head)
        return out.reshape(output.shape)
    return row  # HEADS, NORMED: the projection holds this row alone


def row_part(output: torch.Tensor, site: Site, n_heads: int, d_head: int) -> torch.Tensor:
    """`site`'s row read out of its projection module's output [..., out]: [..., heads * d_head]
    (heads concatenated, as splice_row takes it)."""
    split = site.split
    if split.kind == FUSED:
        size = output.shape[-1] // split.parts
        return output[..., split.part * size : (split.part + 1) * size]
    if split.kind == FUSED_HEADS:
        per_head = output.reshape(*output.shape[:-1], n_heads, split.parts, d_head)  # [..., head, parts, d_head]
        return per_head[..., split.part, :].reshape(*output.shape[:-1], n_heads * d_head)
    return output  # HEADS, NORMED: the projection holds this row alone
