"""One adapter per model family; `adapter_for(model)` picks it from the config's `model_type`.

An adapter is a stateless view of a Hugging Face model (the model and its config, read on demand), so
`adapter_for` builds one per call and never writes to the model; a `LoadedModel` holds its model's adapter
(`loaded.adapter`, headlens.load.models), which is what code holding a loaded model uses.

The table names each family's module and class; a family's module is imported when the first model of
that family is adapted, so a GPT-2 run loads no rotary or Llama code (as transformers' auto classes
import a model's module only when it is asked for).
"""

from __future__ import annotations

import importlib

from headlens.arch.base import Adapter, LayerContext, get_module, kv_group
from headlens.arch.hooks import Hooks
from headlens.arch.sites import Site, Sites, Split
from headlens.bounds import shown
from headlens.errors import UnsupportedModelError

# model_type -> (module of headlens.arch, adapter class in it). Adding a family is adding a module and a line here.
ADAPTERS: dict[str, tuple[str, str]] = {
    "gemma3_text": ("gemma3", "Gemma3Adapter"),
    "gpt2": ("gpt2", "GPT2Adapter"),
    "gpt_neox": ("neox", "NeoXAdapter"),
    "llama": ("llama", "LlamaAdapter"),
    "mistral": ("mistral", "MistralAdapter"),
    "qwen2": ("qwen", "Qwen2Adapter"),
    "qwen3": ("qwen", "Qwen3Adapter"),
}
SUPPORTED_TYPES = tuple(ADAPTERS)


def check_supported(model_type: str | None, where: str = "model") -> None:
    """UnsupportedModelError naming the supported families unless `model_type` has an adapter."""
    if not isinstance(model_type, str) or model_type not in ADAPTERS:  # a list or an object is no family either
        raise UnsupportedModelError(
            f"{where}: model_type {shown(model_type, 60)} is not supported; headlens reads {', '.join(SUPPORTED_TYPES)}"
        )


def adapter_class(model_type: str | None) -> type[Adapter]:
    """The adapter class of a supported `model_type` (its module imported on first use)."""
    check_supported(model_type)
    module, name = ADAPTERS[model_type]
    return getattr(importlib.import_module(f"headlens.arch.{module}"), name)


def adapter_for(model) -> Adapter:
    """A new adapter of a Hugging Face causal LM (the model is left as it is). UnsupportedModelError for a
    family without one."""
    return adapter_class(getattr(model.config, "model_type", None))(model)


__all__ = [
    "ADAPTERS",
    "SUPPORTED_TYPES",
    "Adapter",
    "Hooks",
    "LayerContext",
    "Site",
    "Sites",
    "Split",
    "adapter_class",
    "adapter_for",
    "check_supported",
    "get_module",
    "kv_group",
]
