"""Float tolerances by dtype for score parity, and the needle prompts and step-by-step decoding comparison of
the retrieval-cache tests (shared with the GPU tests)."""

from __future__ import annotations

import torch

from headlens.arch import adapter_for
from headlens.probes import inputs as probes
from headlens.probes.inputs import random_token_range
from headlens.scores.retrieval import (
    count_copy_paste,
    decode_cached,
    decode_uncached,
)

# Scores are attention masses and z-scores in [-1, 1]. A half-precision model rounds every
# weight and activation to ~eps(dtype); on the strong test model the largest score difference
# from float32 is ~1 eps (bfloat16: 0.007 on copying_score; float16 ~0.13 eps). Allowed: 4 eps.
SCORE_EPS_MULTIPLE = 4


# copying_score is an erf of the head's direct-path logit z-score, computed from the z the half
# model itself produced (every layer's rounding before it, not just the attention weights): on the
# 3-layer GQA Llama of tests/helpers/families.py it moved by up to ~5 eps (bfloat16) and ~9 eps (float16).
COPYING_EPS_MULTIPLE = 16


def dtype_tolerance(column: str, dtype: torch.dtype) -> float:
    multiple = COPYING_EPS_MULTIPLE if column == "copying_score" else SCORE_EPS_MULTIPLE
    return multiple * torch.finfo(dtype).eps


def cache_prompts(loaded, text, n_ctx=None):
    spec = loaded.spec
    n_ctx = n_ctx or spec.n_ctx
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    needle_len = min(16, max(2, n_ctx // 8))
    return probes.needle_prompts(
        ids,
        n_ctx,
        loaded.bos_token_id,
        random_token_range(spec.d_vocab),
        needle_len=needle_len,
        restate=min(4, needle_len - 1),
        seed=0,
    )


def assert_same_steps(model, prompts):
    """Every group of equal-length prompts decodes to identical tokens and argmax keys, both ways."""
    groups: dict[int, list] = {}
    for test in prompts:
        groups.setdefault(len(test.prompt), []).append(test)
    adapter = adapter_for(model)
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    with torch.no_grad():
        for group in groups.values():
            ids = torch.tensor([test.prompt for test in group])  # [test, pos]
            n_steps = len(group[0].needle) - group[0].restate
            uncached, cached = list(decode_uncached(model, ids, n_steps)), list(decode_cached(model, ids, n_steps))
            assert len(uncached) == len(cached) == n_steps
            for (w_ref, keys_ref), (w, keys) in zip(uncached, cached, strict=True):
                assert torch.equal(w_ref, w)
                assert sorted(keys_ref) == sorted(keys) == list(range(n_layers))
                for layer, ref in keys_ref.items():
                    assert ref.shape == (len(group), n_heads)
                    assert torch.equal(ref, keys[layer]), layer
            hits_ref = count_copy_paste(group, iter(uncached), n_layers, n_heads)
            hits = count_copy_paste(group, iter(cached), n_layers, n_heads)
            assert torch.equal(hits_ref[0], hits[0]) and hits_ref[1] == hits[1]
