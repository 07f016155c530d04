"""The clean run of a model on an evaluation set, computed once and kept in headlens's cache.

The clean run's metric value at every scored position (`EvalSet.counted`, row-major) depends only on
the model's weights, the set, the dtype, the device and how the set is cut into forward passes. Its
key in headlens.cache (kind "clean-runs") hashes all of them: the weights as they are in memory
(loaded.digest(), so a model edited in memory gets its own key), the set's digest (`EvalSet.data_hash`),
the metric, the attention kernel and the passes' slices. An entry is the values as torch saves them; one
that does not read back as a float tensor of the set's scored positions is recomputed.

`run_sets` evaluates head sets ablated together, every one from the clean residual at the first
layer any of them ablates (headlens.intervene.stacked.set_values), taking the clean values from the
cache or computing them in the same pass (as one more set, with no heads) and caching them.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Sequence

import torch

from headlens import cache
from headlens.arch.context import NO_PATTERN
from headlens.arch.kernels import onednn_available
from headlens.heads import Head
from headlens.intervene.stacked import set_values
from headlens.load.models import LoadedModel

KIND = "clean-runs"
NO_CACHE_ENV = "HEADLENS_NO_CLEAN_CACHE"  # set (to anything): neither read nor write clean runs


def clean_key(loaded: LoadedModel, evalset, batches: Sequence[slice]) -> str:
    """The cache key of the clean run of `loaded` on `evalset` cut into `batches`."""
    param = next(loaded.model.parameters())
    return cache.key(
        KIND,
        loaded.digest(),
        data=evalset.data_hash,
        metric=evalset.metric,
        dtype=str(param.dtype),
        device=param.device.type,
        attention=NO_PATTERN,
        onednn=onednn_available(),
        cuts=[(b.start, b.stop) for b in batches],
    )


def read_clean(key: str, n_scored: int) -> torch.Tensor | None:
    """The cached clean values [n_scored] float64, or None (absent, unreadable, wrong shape, cache off)."""
    if os.environ.get(NO_CACHE_ENV):
        return None
    try:
        values = torch.load(io.BytesIO(cache.get(KIND, key)), weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, TypeError, pickle.UnpicklingError):
        return None
    if not isinstance(values, torch.Tensor) or values.shape != (n_scored,) or not values.is_floating_point():
        return None
    return values.double()


def write_clean(key: str, values: torch.Tensor, model: str = "") -> None:
    """Keep the clean values [n_scored] of `model` (headlens.cache.put: one that cannot be written is
    skipped, the run does not need it)."""
    if os.environ.get(NO_CACHE_ENV):
        return
    buffer = io.BytesIO()
    torch.save(values.detach().double().cpu().clone(), buffer)
    cache.put(KIND, key, buffer.getvalue(), model=model)


def clean_values(loaded: LoadedModel, evalset, batch_size: int | None, on_pass=None) -> torch.Tensor:
    """The clean values [n_scored] float64: from the cache, or one clean run (then cached)."""
    key, cached = lookup(loaded, evalset, batch_size)
    if cached is not None:
        return cached
    values = set_values(loaded.model, evalset, [[]], [None] * loaded.spec.n_layers, batch_size, on_pass=on_pass)[0]
    write_clean(key, values, loaded.display_name)
    return values


def run_sets(
    loaded: LoadedModel,
    evalset,
    head_sets: Sequence[Sequence[Head]],
    reps,
    batch_size: int | None,
    cached=None,
    on_pass=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(clean values [n_scored], each set's values [n_sets, n_scored]); every set from the clean
    residual at its first ablated layer. `cached`: (key, the clean values or None) from `lookup`,
    else looked up here; clean values computed here are cached."""
    key, clean = cached if cached is not None else lookup(loaded, evalset, batch_size)
    sets = list(head_sets) if clean is not None else [[], *head_sets]
    values = set_values(loaded.model, evalset, sets, reps, batch_size, on_pass=on_pass)  # [n_sets(+1), n_scored]
    if clean is not None:
        return clean, values
    write_clean(key, values[0], loaded.display_name)
    return values[0], values[1:]


def lookup(loaded: LoadedModel, evalset, batch_size: int | None) -> tuple[str, torch.Tensor | None]:
    """The clean run's cache key and its cached values [n_scored] (None when not cached)."""
    key = clean_key(loaded, evalset, evalset.row_batches(batch_size))
    return key, read_clean(key, evalset.n_tokens)


def pass_count(evalset, n_sets: int, batch_size: int | None, cached: bool) -> int:
    """Forward passes `run_sets` makes (a progress bar's total)."""
    return len(evalset.row_batches(batch_size)) * (n_sets + (0 if cached else 1))
