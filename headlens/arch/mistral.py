"""Mistral (`MistralForCausalLM`): Llama's modules, plus sliding-window attention on every layer
when `config.sliding_window` is set (None: full causal attention, as in Mistral 7B v0.2+).

The base model masks with `create_sliding_window_causal_mask` then: a query at position q sees
keys q - sliding_window + 1 .. q (transformers' `sliding_window_overlay`).
"""

from __future__ import annotations

from transformers.models.mistral import modeling_mistral

from headlens.arch.context import FULL, SLIDING
from headlens.arch.llama import LlamaAdapter, llama_sites


class MistralAdapter(LlamaAdapter):
    family = "mistral"
    sites = llama_sites(modeling_mistral)

    def layer_types(self) -> list[str]:
        kind = FULL if getattr(self.config, "sliding_window", None) is None else SLIDING
        return [kind] * self.n_layers
