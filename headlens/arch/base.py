"""The architecture adapter: where a model family keeps each head, read from its site table.

Every stage of headlens that touches a head reads it through an `Adapter` and nothing else. The
family's facts are data, its `Sites` table (headlens.arch.sites: q, k, v, z and o rows with their
hook directions and split rules, the norms, the rotary module and function); the adapter derives
everything else from it:
- `hooks()`: the scoped hook context (headlens.arch.hooks) every hook is registered in;
- `hook_z(L, fn)`: the one place the z site (the output projection's input) is wired. fn sees z
  [batch, pos, head, d_head] (TransformerLens `hook_z`) and may return a replacement (ablation, gates);
- `w_o(L)`: each head's slice of the output projection, [head, d_head, d_model];
- `hook_qkv(L, fn)`: the layer's own queries, keys and values after every position and norm
  transform (rotary, q/k norm), q [batch, head, pos, d_head], k and v [batch, kv_head, pos, d_head]
  (the lean capture path rebuilds patterns from them);
- `context(ids, mask)` + `attention` + `finish_block` (`block`, `run_from`): one decoder layer,
  or the layers from one on, run on a given residual stream (the exact suffix sweep);
  `final_norm` (`final_norm_centres`: LayerNorm or RMSNorm) + `unembed` for the logits;
- `attention_weights(L)`: the layer's attention weights for the from-scratch attention (headlens.arch.mha);
- `sliding_window(L)`: how far back a layer's queries see (None: full causal attention).
Heads are always query heads (`L.H`, H < n_heads); `kv_group(H)` is the key/value head H reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from headlens.arch.context import FULL, SLIDING, LayerContext, layer_context
from headlens.arch.hooks import Hooks
from headlens.arch.mha import GroupedQueryAttention
from headlens.arch.sites import CONV1D, INPUT, NORMED, Site, Sites, get_module, row_weights, to_heads

ZFn = Any  # Callable[[torch.Tensor], torch.Tensor | None]: z [batch, pos, head, d_head] -> new z or None


def kv_group(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head that query head `head` reads: each is shared by n_heads / n_kv_heads
    consecutive query heads (GQA/MQA, Ainslie et al. 2023; Hugging Face `repeat_kv`)."""
    return head // (n_heads // n_kv_heads)


class Adapter:
    """Base adapter: everything that follows from the site table. A family sets `sites`."""

    family: ClassVar[str] = ""
    sites: ClassVar[Sites]

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config

    # Shape facts (transformers' config names; GPT-2's own names are aliased by its config) ------
    @property
    def n_layers(self) -> int:
        return len(self.layers())

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def d_head(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.d_model // self.n_heads)

    @property
    def n_ctx(self) -> int:
        return int(self.config.max_position_embeddings)

    @property
    def d_vocab(self) -> int:
        return int(self.config.vocab_size)

    def kv_group(self, head: int) -> int:
        """The key/value head that query head `head` reads (GQA/MQA share one among several)."""
        return kv_group(head, self.n_heads, self.n_kv_heads)

    @property
    def parallel_residual(self) -> bool:
        """True if attention and MLP both read the block's input (GPT-NeoX's `use_parallel_residual`)."""
        flag = self.sites.parallel_residual
        return flag is not None and bool(getattr(self.config, flag, True))

    # Modules -----------------------------------------------------------------------------
    def layers(self) -> nn.ModuleList:
        return get_module(self.model, self.sites.layers)

    def layer(self, layer: int) -> nn.Module:
        return self.layers()[layer]

    def attn(self, layer: int) -> nn.Module:
        return get_module(self.layer(layer), self.sites.attn)

    def site_module(self, layer: int, site: Site) -> nn.Module:
        """The module of a row of the site table in `layer`."""
        return get_module(self.layer(layer), site.module)

    def z_module(self, layer: int) -> nn.Module:
        """The module whose input is z: the output projection."""
        return self.site_module(layer, self.sites.z)

    def trunk(self) -> nn.Module:
        return get_module(self.model, self.sites.trunk)

    def embed(self) -> nn.Module:
        return get_module(self.model, self.sites.embed)

    def final_norm(self) -> nn.Module:
        return get_module(self.model, self.sites.final_norm)

    def unembed(self) -> nn.Module:
        return get_module(self.model, self.sites.unembed)

    @property
    def final_norm_centres(self) -> bool:
        """True if the final norm subtracts the mean (LayerNorm), False for RMSNorm (no centring)."""
        return isinstance(self.final_norm(), nn.LayerNorm)

    def final_norm_gain(self) -> torch.Tensor | None:
        """The final norm's per-dimension gain as it multiplies, [d_model] (None: no gain)."""
        return getattr(self.final_norm(), "weight", None)

    def attn_out_gain(self, layer: int) -> torch.Tensor | None:
        """Gain [d_model] of a norm between `layer`'s attention output and the residual add (None:
        the output is added as it is). The direct path of a head's output runs through it."""
        return None

    def attn_out_norm_module(self, layer: int) -> nn.Module | None:
        """That norm itself (None: the attention output is added as it is)."""
        return None

    # Hook sites ---------------------------------------------------------------------------
    def hooks(self) -> Hooks:
        """A scoped hook context on this model (headlens.arch.hooks): `with adapter.hooks() as hooks:`."""
        return Hooks(self)

    def hook_site(self, layer: int, site: Site, fn):
        """Hook `site` of `layer` in its direction: fn(tensor) sees the module's first input (INPUT)
        or its output (OUTPUT); a tensor it returns replaces it. Returns the handle (remove it)."""
        module = self.site_module(layer, site)
        if site.hook == INPUT:

            def pre_hook(module, args):
                new = fn(args[0])
                return None if new is None else (new, *args[1:])

            return module.register_forward_pre_hook(pre_hook)
        return module.register_forward_hook(lambda module, args, output: fn(output))

    def hook_z(self, layer: int, fn: ZFn):
        """The z site of `layer`: fn(z) sees z [batch, pos, head, d_head]; a tensor it returns
        replaces z. Returns the handle (remove it)."""
        n_heads = getattr(self, self.sites.z.split.heads)

        def on_z(merged):  # [batch, pos, head * d_head]
            z = merged.view(*merged.shape[:-1], n_heads, merged.shape[-1] // n_heads)  # [batch, pos, head, d_head]
            new = fn(z)
            return None if new is None else new.reshape(merged.shape)

        return self.hook_site(layer, self.sites.z, on_z)

    def hook_qkv(self, layer: int, fn) -> list:
        """Hooks that call fn(q, k, v) once per forward of `layer` with q [batch, head, pos,
        d_head] and k, v [batch, kv_head, pos, d_head], as the attention uses them: the q, k, v
        rows' tensors split into heads, then rotated by the family's rotary function with the
        cos/sin the model handed to the attention (a forward pre-hook with kwargs)."""
        rows = (self.sites.q, self.sites.k, self.sites.v)
        modules = list(dict.fromkeys(row.module for row in rows))  # distinct modules: one for a fused QKV
        rotate, seen = self.sites.rotary, {}

        def on_call(module, args, kwargs):
            seen.clear()
            if rotate is not None:
                seen["cos_sin"] = kwargs["position_embeddings"]  # 2 x [1 | batch, pos, rotary_dim]

        def keep(path: str):
            def on_tensor(tensor):
                seen[path] = tensor.detach()
                if all(p in seen for p in modules):
                    q, k, v = (self.split_heads(seen[row.module], row) for row in rows)
                    for p in modules:
                        del seen[p]
                    if rotate is not None:
                        q, k = rotate(q, k, *seen["cos_sin"])  # [batch, head | kv_head, pos, d_head]
                    fn(q, k, v)

            return on_tensor

        handles = [self.attn(layer).register_forward_pre_hook(on_call, with_kwargs=True)]
        first = {row.module: row for row in rows}
        return handles + [self.hook_site(layer, first[path], keep(path)) for path in modules]

    def split_heads(self, tensor: torch.Tensor, site: Site) -> torch.Tensor:
        """A q, k or v row's hooked tensor as [batch, heads, pos, d_head] (its split rule)."""
        return to_heads(tensor, site.split, getattr(self, site.split.heads), self.d_head)

    # Weights ------------------------------------------------------------------------------
    def w_o(self, layer: int) -> torch.Tensor:
        """Each head's slice of the output projection: [head, d_head, d_model] (z_h @ w_o[h])."""
        weight = get_module(self.layer(layer), self.sites.o.projection).weight
        if self.sites.o.layout == CONV1D:  # [head * d_head, d_model]
            return weight.view(self.n_heads, self.d_head, -1)  # [head, d_head, d_model] (a view)
        return weight.t().reshape(self.n_heads, self.d_head, -1)  # nn.Linear [d_model, head * d_head] -> same

    def qkv_weights(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight [heads * d_head, d_model], bias or None) of the query, key and value projections."""
        block = self.layer(layer)
        return [
            row_weights(get_module(block, row.projection), row, getattr(self, row.split.heads), self.d_head)
            for row in (self.sites.q, self.sites.k, self.sites.v)
        ]

    def qk_norms(self, layer: int) -> tuple[nn.Module | None, nn.Module | None]:
        """The per-head norms the q and k rows are read after (Qwen3's q_norm, k_norm), or None."""
        return tuple(
            self.site_module(layer, row) if row.split.kind == NORMED else None for row in (self.sites.q, self.sites.k)
        )

    def attention_scale(self, layer: int) -> float:
        """The factor Q K^T is multiplied by before the softmax."""
        if self.sites.scale is not None:
            return float(self.sites.scale(self.config, layer))
        return float(getattr(self.attn(layer), "scaling", self.d_head**-0.5))

    def attention_weights(self, layer: int):
        """`headlens.arch.mha.AttentionWeights` of `layer`, for the from-scratch GroupedQueryAttention."""
        raise NotImplementedError  # families with rotary positions (headlens.arch.rotary) provide it

    def scratch_attention(self, layer: int) -> nn.Module:
        """headlens.arch.mha's from-scratch attention holding `layer`'s weights (what `validate` compares):
        the table's `scratch` where the family has its own, else GroupedQueryAttention of `attention_weights`."""
        if self.sites.scratch is not None:
            return self.sites.scratch(self.attn(layer), self.config, layer)
        return GroupedQueryAttention(self.attention_weights(layer)).eval()

    # Layer types and masks ----------------------------------------------------------------
    def layer_types(self) -> list[str]:
        """FULL or SLIDING per layer (transformers' `config.layer_types` where the family has it)."""
        types = getattr(self.config, "layer_types", None)
        if types is not None:
            return list(types)[: self.n_layers]
        return [FULL] * self.n_layers

    def sliding_window(self, layer: int) -> int | None:
        """Keys further back than this many positions are masked (None: full causal)."""
        if self.layer_types()[layer] != SLIDING:
            return None
        return getattr(self.config, "sliding_window", None)

    # Running one layer --------------------------------------------------------------------
    def context(self, input_ids: torch.Tensor, mask: torch.Tensor) -> LayerContext:
        """Masks (and rotary cos/sin, for families with a rotary module) built as the base
        model's forward builds them (headlens.arch.context)."""
        return layer_context(self, input_ids, mask)

    def embed_tokens(self, ctx: LayerContext) -> torch.Tensor:
        """Residual stream entering layer 0: [batch, pos, d_model]."""
        resid = self.embed()(ctx.input_ids)  # [batch, pos, d_model]
        if self.sites.pos_embed is not None:
            resid = resid + get_module(self.model, self.sites.pos_embed)(ctx.position_ids)  # [batch, pos, d_model]
        if self.sites.embed_dropout is not None:
            resid = get_module(self.model, self.sites.embed_dropout)(resid)
        return resid

    def attention(
        self, layer: int, resid: torch.Tensor, ctx: LayerContext, copies: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """z [batch, pos, head, d_head] and the attention output [batch, pos, d_model] of a layer."""
        block = self.layer(layer)
        seen: list[torch.Tensor] = []
        with self.hooks() as hooks:
            hooks.z(layer, seen.append)
            out = get_module(block, self.sites.attn)(
                get_module(block, self.sites.input_norm)(resid), **ctx.attn_kwargs(copies, layer)
            )[0]
        return seen[0], out

    def finish_block(self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual leaving `layer` from the residual entering it and its attention output."""
        block = self.layer(layer)
        mlp, norm = get_module(block, self.sites.mlp), get_module(block, self.sites.post_norm)
        if self.parallel_residual:  # summed in GPT-NeoX's order, so the sums round alike
            return mlp(norm(resid)) + attn_out + resid  # [batch, pos, d_model]
        mid = resid + attn_out
        return mid + mlp(norm(mid))  # [batch, pos, d_model]

    def block(self, layer: int, resid: torch.Tensor, ctx: LayerContext, copies: int = 1) -> torch.Tensor:
        """Residual leaving `layer` from the residual entering it: its attention, then `finish_block`."""
        _, out = self.attention(layer, resid, ctx, copies)
        return self.finish_block(layer, resid, out)

    def run_from(
        self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor, ctx: LayerContext, copies: int = 1
    ) -> torch.Tensor:
        """Final residual from layer `layer`'s input and (edited) attention output: its MLP, then
        every later layer. [copies * batch, pos, d_model]"""
        resid = self.finish_block(layer, resid, attn_out)
        for later in range(layer + 1, self.n_layers):
            resid = self.block(later, resid, ctx, copies)
        return resid

    def run_trunk(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The base model's final hidden state (final norm applied): [batch, pos, d_model]."""
        return self.trunk()(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
