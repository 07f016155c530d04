"""One adapter per model family; `adapter_for(model)` picks it from the config's `model_type`."""

from __future__ import annotations

from headlens.arch.base import Adapter, LayerContext, get_module, kv_group
from headlens.arch.gemma3 import Gemma3Adapter
from headlens.arch.gpt2 import GPT2Adapter
from headlens.arch.hooks import Hooks
from headlens.arch.llama import LlamaAdapter
from headlens.arch.mistral import MistralAdapter
from headlens.arch.neox import NeoXAdapter
from headlens.arch.qwen import Qwen2Adapter, Qwen3Adapter
from headlens.arch.sites import Site, Sites, Split
from headlens.errors import UnsupportedModelError

# model_type -> adapter class. Adding a family is adding a module and a line here.
ADAPTERS: dict[str, type[Adapter]] = {
    "gemma3_text": Gemma3Adapter,
    "gpt2": GPT2Adapter,
    "gpt_neox": NeoXAdapter,
    "llama": LlamaAdapter,
    "mistral": MistralAdapter,
    "qwen2": Qwen2Adapter,
    "qwen3": Qwen3Adapter,
}
SUPPORTED_TYPES = tuple(ADAPTERS)


def check_supported(model_type: str | None, where: str = "model") -> None:
    """UnsupportedModelError naming the supported families unless `model_type` has an adapter."""
    if model_type not in ADAPTERS:
        raise UnsupportedModelError(
            f"{where}: model_type {model_type!r} is not supported; headlens reads {', '.join(SUPPORTED_TYPES)}"
        )


def adapter_for(model) -> Adapter:
    """The adapter of a Hugging Face causal LM, cached on the model."""
    cached = getattr(model, "_headlens_adapter", None)
    if cached is not None:
        return cached
    model_type = getattr(model.config, "model_type", None)
    check_supported(model_type)
    adapter = ADAPTERS[model_type](model)
    model._headlens_adapter = adapter  # a plain attribute (not a Module): nn.Module stores it as is
    return adapter


__all__ = [
    "ADAPTERS",
    "SUPPORTED_TYPES",
    "Adapter",
    "Hooks",
    "LayerContext",
    "Site",
    "Sites",
    "Split",
    "adapter_for",
    "check_supported",
    "get_module",
    "kv_group",
]
