"""Copy suppression's two vocabulary criteria (headlens.scores.ov_vocab, headlens.scores.qk_vocab), computed
once per model and kept in headlens's cache.

Both read only the weights: the same model, seed, OV cut-off (which gates the QK layers), dtype and device
give the same tensors, and on a large vocabulary they are over half of classify's time (BENCHMARKS.md). The
entry (headlens.cache, kind "vocab-criteria") is the tensors as torch saves them; its key hashes the weights as
they are in memory (loaded.digest(): a model edited after loading gets its own entry), those settings and the
sample sizes. It is read back with `torch.load(weights_only=True)`; an entry that does not read back as the
expected tensors is computed again. Setting NO_CACHE_ENV (to anything) neither reads nor writes entries, nor
does a model whose weights accelerate offloaded (their digest would need every offloaded weight read back).
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Callable

import torch

from headlens import cache
from headlens.load.models import LoadedModel
from headlens.scores.ov_vocab import SCREEN, VOCAB_SAMPLE

KIND = "vocab-criteria"
NO_CACHE_ENV = "HEADLENS_NO_VOCAB_CACHE"
TENSORS = ("cs_ov_score", "cs_qk_score", "ov_se", "qk_se", "ov_ci_half", "qk_ci_half")


def vocab_key(loaded: LoadedModel, seed: int, ov_min: float) -> str:
    """The cache key of `loaded`'s vocabulary criteria under `seed` and the OV cut-off `ov_min`."""
    param = next(loaded.model.parameters())
    return cache.key(
        KIND,
        loaded.digest(),
        seed=seed,
        ov_min=ov_min,
        dtype=str(param.dtype),
        device=param.device.type,
        sample=[SCREEN, VOCAB_SAMPLE],
    )


def cached_criteria(loaded: LoadedModel, seed: int, ov_min: float, compute: Callable[[], dict]) -> dict:
    """The criteria dict `compute()` returns (TENSORS [n_layers, n_heads] float64, plus JSON-ready facts under
    "facts"): from the cache when an entry reads back whole, else computed now and kept."""
    if os.environ.get(NO_CACHE_ENV) or any(p.device.type == "meta" for p in loaded.model.parameters()):
        return compute()  # off, or weights accelerate offloaded (not in memory to digest): computed
    entry_key = vocab_key(loaded, seed, ov_min)
    shape = (loaded.spec.n_layers, loaded.spec.n_heads)
    try:
        entry = torch.load(io.BytesIO(cache.get(KIND, entry_key)), weights_only=True)
        if all(isinstance(entry[name], torch.Tensor) and entry[name].shape == shape for name in TENSORS):
            return {**{name: entry[name] for name in TENSORS}, "facts": json.loads(entry["facts"])}
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, TypeError, pickle.UnpicklingError):
        pass
    result = compute()
    entry = {**{name: result[name].double().cpu() for name in TENSORS}, "facts": json.dumps(result["facts"])}
    buffer = io.BytesIO()
    torch.save(entry, buffer)
    cache.put(KIND, entry_key, buffer.getvalue(), model=loaded.display_name)
    return result
