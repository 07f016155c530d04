"""Where model files come from: a local Hugging Face directory, checked before it is loaded, or
the Hugging Face hub cache (HF_HOME respected), downloading safetensors weights only when the hub
can be reached and HF_HUB_OFFLINE is not set. Every failure is one ModelLoadError line.
"""

from __future__ import annotations

import os
from pathlib import Path

from headlens.arch import check_supported
from headlens.bounds import check_shape
from headlens.errors import ModelLoadError
from headlens.files import read_json

# Files a hub snapshot needs; weights are safetensors only (never pickles from the network).
HUB_PATTERNS = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
]


def check_local_dir(path: Path) -> None:
    """A model directory: config.json of a supported family and readable weights (safetensors headers
    checked against the file size), else one ModelLoadError line."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: expected a Hugging Face model directory")
    config = read_json(path / "config.json", "model config", ModelLoadError)
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path / 'config.json'} holds a JSON {type(config).__name__}, not an object")
    check_supported(config.get("model_type"), str(path))
    check_config_shape(config, str(path / "config.json"))
    weights = path / "model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(weights), framework="pt") as handle:
                names = list(handle.keys())
                # safe_open checks the header against the file size (truncation); get_slice checks
                # each entry's dtype and shape metadata
                for key in names:
                    handle.get_slice(key)
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"{weights} is corrupt or truncated: {exc}") from None
        if not names:
            raise ModelLoadError(f"{weights} holds no tensors")
    elif (path / "model.safetensors.index.json").is_file():
        pass
    elif not (path / "pytorch_model.bin").is_file():
        raise ModelLoadError(f"{path} has no weights: expected model.safetensors (or pytorch_model.bin)")


# ModelSpec fact -> the config keys the supported families spell it with (GPT-2 first, then the others)
CONFIG_KEYS = {
    "n_layers": ("n_layer", "num_hidden_layers"),
    "n_heads": ("n_head", "num_attention_heads"),
    "d_model": ("n_embd", "hidden_size"),
    "n_kv_heads": ("num_key_value_heads",),
    "d_head": ("head_dim",),
}


def check_config_shape(config: dict, where: str) -> None:
    """headlens.bounds.check_shape on the facts a config.json declares (a nested text_config too), before
    transformers builds anything from it."""
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            facts = {fact: next((section[k] for k in keys if k in section), None) for fact, keys in CONFIG_KEYS.items()}
            check_shape(where, **facts)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment *now* (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub). huggingface_hub reads these once at import,
    so a later change of HF_HOME would otherwise be ignored."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_hub(name: str) -> Path:
    """Find a hub id in the Hugging Face cache (HF_HOME respected), downloading if allowed.

    Only the files in HUB_PATTERNS are fetched: safetensors weights, never pickles.
    """
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, cache_dir=cache, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises several types): try the network unless told not to
        pass
    hint = (
        f"weights for {name!r} are not in the Hugging Face cache ({cache}) and the hub cannot be reached. "
        f"Provide them: run once on a machine with network "
        f"(python -c \"from huggingface_hub import snapshot_download; snapshot_download('{name}')\") "
        f"and copy the cache to HF_HOME, or pass a local directory with config.json + model.safetensors"
    )
    if hub_offline():
        raise ModelLoadError(hint)
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, cache_dir=cache, etag_timeout=10))
    except Exception as exc:
        raise ModelLoadError(f"{hint} ({type(exc).__name__})") from None
