"""The architecture adapter: where a model family keeps each head, in one table per family.

Every stage of headlens that touches a head reads it through an `Adapter` and nothing else:
- `sites`: the module paths of the family (pyvene-style site table), e.g. GPT-2's z site is
  `transformer.h[L].attn.c_proj`'s input, Llama's `model.layers[L].self_attn.o_proj`'s input;
- `hook_z(L, fn)`: the one place the z pre-hook is wired. fn sees z [batch, pos, head, d_head]
  (TransformerLens `hook_z`) and may return a replacement (ablation, gates);
- `w_o(L)`: each head's slice of the output projection, [head, d_head, d_model];
- `hook_qkv(L, fn)`: the layer's own queries, keys and values after every position and norm
  transform (rotary, q/k norm), q [batch, head, pos, d_head], k and v [batch, kv_head, pos, d_head]
  (the lean capture path rebuilds patterns from them);
- `context(ids, mask)` + `attention` + `finish_block`: one decoder layer run on a given residual
  stream (the exact suffix sweep), `final_norm` (`final_norm_centres`: LayerNorm or RMSNorm) +
  `unembed` for the logits;
- `attention_weights(L)`: the layer's attention weights for the from-scratch attention (headlens.mha);
- `sliding_window(L)`: how far back a layer's queries see (None: full causal attention).
Heads are always query heads (`L.H`, H < n_heads); `kv_group(H)` is the key/value head H reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from headlens.mha import GroupedQueryAttention

ZFn = Any  # Callable[[torch.Tensor], torch.Tensor | None]: z [batch, pos, head, d_head] -> new z or None


@dataclass(frozen=True)
class Sites:
    """Module paths of one family, relative to the *LM* model; `{L}` is the layer index."""

    layers: str  # the list of decoder layers
    attn: str  # attention module, relative to a layer
    z: str  # module whose *input* is z (the output projection), relative to a layer
    input_norm: str  # norm before attention, relative to a layer
    post_norm: str  # norm before the MLP, relative to a layer
    mlp: str  # relative to a layer
    embed: str  # token embedding
    final_norm: str  # norm after the last layer
    unembed: str  # LM head
    trunk: str  # the base model without its LM head


@dataclass
class LayerContext:
    """What every layer of one batch needs besides its residual stream."""

    input_ids: torch.Tensor  # [batch, pos]
    mask: torch.Tensor  # [batch, pos] bool, True on real tokens
    position_ids: torch.Tensor  # [1, pos]
    attn_mask: torch.Tensor | None  # additive or bool causal + padding mask from transformers, or None
    extra: dict  # family-specific keyword arguments of the attention module (rotary cos/sin, ...)
    layer_masks: dict = field(default_factory=dict)  # layer -> its own mask where it differs (sliding window)

    def attn_kwargs(self, copies: int = 1, layer: int | None = None) -> dict:
        """Keyword arguments of the attention module of `layer` for `copies` stacked copies of the batch."""
        mask = self.layer_masks.get(layer, self.attn_mask)
        if mask is not None and copies > 1:
            mask = mask.repeat(copies, *([1] * (mask.dim() - 1)))  # [copies * batch, 1, q_pos, k_pos]
        return {"attention_mask": mask, **self.extra}


def get_module(root: nn.Module, path: str) -> nn.Module:
    """`root.a.b[3].c` for path "a.b.3.c" (empty path: root)."""
    module = root
    for part in filter(None, path.split(".")):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


class Adapter:
    """Base adapter: everything that follows from the site table. Families override the rest."""

    family: ClassVar[str] = ""
    sites: ClassVar[Sites]
    parallel_residual: bool = False  # GPT-NeoX: attention and MLP both read the block's input

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config

    # Shape facts -------------------------------------------------------------------------
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
        return head // (self.n_heads // self.n_kv_heads)

    # Modules -----------------------------------------------------------------------------
    def layers(self) -> nn.ModuleList:
        return get_module(self.model, self.sites.layers)

    def layer(self, layer: int) -> nn.Module:
        return self.layers()[layer]

    def attn(self, layer: int) -> nn.Module:
        return get_module(self.layer(layer), self.sites.attn)

    def z_module(self, layer: int) -> nn.Module:
        return get_module(self.layer(layer), self.sites.z)

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

    # The z site, wired once ---------------------------------------------------------------
    def hook_z(self, layer: int, fn: ZFn):
        """Forward pre-hook on the output projection of `layer`: fn(z) sees z [batch, pos, head,
        d_head]; a tensor it returns replaces z. Returns the handle (remove it)."""
        n_heads = self.n_heads

        def hook(module, args):
            merged = args[0]  # [batch, pos, head * d_head]
            z = merged.view(*merged.shape[:-1], n_heads, merged.shape[-1] // n_heads)  # [batch, pos, head, d_head]
            new = fn(z)
            if new is None:
                return None
            return (new.reshape(merged.shape), *args[1:])

        return self.z_module(layer).register_forward_pre_hook(hook)

    def w_o(self, layer: int) -> torch.Tensor:
        """Each head's slice of the output projection: [head, d_head, d_model] (z_h @ w_o[h])."""
        weight = self.z_module(layer).weight  # nn.Linear: [d_model, head * d_head]
        return weight.t().reshape(self.n_heads, self.d_head, -1)  # [head, d_head, d_model]

    # Q, K, V ------------------------------------------------------------------------------
    def attention_scale(self, layer: int) -> float:
        """The factor Q K^T is multiplied by before the softmax."""
        return float(getattr(self.attn(layer), "scaling", self.d_head**-0.5))

    def hook_qkv(self, layer: int, fn) -> list:
        """Hooks that call fn(q, k, v) once per forward of `layer` with q [batch, head, pos,
        d_head] and k, v [batch, kv_head, pos, d_head], as the attention uses them."""
        raise NotImplementedError  # each family knows where its projections are

    def attention_weights(self, layer: int):
        """`headlens.mha.AttentionWeights` of `layer`, for the from-scratch GroupedQueryAttention."""
        raise NotImplementedError  # families with rotary positions (headlens.arch.rotary) provide it

    def scratch_attention(self, layer: int) -> nn.Module:
        """headlens.mha's from-scratch attention holding `layer`'s weights (what `validate` compares):
        GroupedQueryAttention of `attention_weights`, unless a family has its own."""
        return GroupedQueryAttention(self.attention_weights(layer)).eval()

    def sliding_window(self, layer: int) -> int | None:
        """Keys further back than this many positions are masked (None: full causal)."""
        return None

    # Running one layer --------------------------------------------------------------------
    def context(self, input_ids: torch.Tensor, mask: torch.Tensor) -> LayerContext:
        raise NotImplementedError  # mask construction and positions are per family

    def embed_tokens(self, ctx: LayerContext) -> torch.Tensor:
        """Residual stream entering layer 0: [batch, pos, d_model]."""
        return self.embed()(ctx.input_ids)

    def attention(self, layer: int, resid: torch.Tensor, ctx: LayerContext,
                  copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """z [batch, pos, head, d_head] and the attention output [batch, pos, d_model] of a layer."""
        block = self.layer(layer)
        seen: list[torch.Tensor] = []
        handle = self.hook_z(layer, lambda z: seen.append(z))
        try:
            out = get_module(block, self.sites.attn)(get_module(block, self.sites.input_norm)(resid),
                                                     **ctx.attn_kwargs(copies, layer))[0]
        finally:
            handle.remove()
        return seen[0], out

    def finish_block(self, layer: int, resid: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual leaving `layer` from the residual entering it and its attention output."""
        block = self.layer(layer)
        mlp, norm = get_module(block, self.sites.mlp), get_module(block, self.sites.post_norm)
        if self.parallel_residual:  # summed in GPT-NeoX's order, so the sums round alike
            return mlp(norm(resid)) + attn_out + resid  # [batch, pos, d_model]
        mid = resid + attn_out
        return mid + mlp(norm(mid))  # [batch, pos, d_model]

    def run_trunk(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The base model's final hidden state (final norm applied): [batch, pos, d_model]."""
        return self.trunk()(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
