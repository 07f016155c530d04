"""Retrieval heads (Wu et al. 2024, arXiv 2404.15574): heads that copy-paste a needle.

During greedy decoding of a needle-in-a-haystack test, at each step with generated token w,
head h *copy-pastes* if (1) w is a needle token and (2) h's argmax key j lies inside the
needle span with token[j] == w. retrieval_score(h) = copy-pasted tokens / tokens asked for,
averaged over the tests the model gets right (Wu et al. count a test only when the answer is
retrieved, ROUGE-1 recall > 50%; here: > 50% of the asked-for needle tokens generated in
place). Wu et al. call a head a retrieval head above 0.1. The prompts are adapted to small
GPT-2 contexts in `headlens.probes.inputs.needle_prompts`.

Decoding, as Wu et al.'s code does it: the prompt is prefilled once into the model's key/value
cache, then each step feeds one token and reads each head's attention row of that new token
only. The prefill runs with sdpa (no [pos, pos] pattern is ever built) and rebuilds just the
last query's row from the layer's own Q and K (`Hooks.qkv`, `mha.pattern_rows`); the
decode steps run eager attention on one query row, [batch, head, 1, k_pos]. A TransformerLens
bridge has no cache here: it re-runs the whole sequence each step (`cache=False`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from headlens import distributed
from headlens.arch import adapter_for
from headlens.arch.context import NO_PATTERN, attention_implementation
from headlens.arch.mha import pattern_rows
from headlens.capture import (
    Batch,
    Reducer,
    attention_pattern,
    capture_hooks,
    forward,
    is_bridge,
    n_heads_of,
    n_layers_of,
)
from headlens.errors import CaptureError

# Wu et al.: a test counts when the answer is retrieved (ROUGE-1 recall > 50%).
RETRIEVED_RECALL = 0.5

# One decoding step: the greedy token of each test [test] and, per layer, each head's argmax
# key at the query that produced it [test, head].
Step = tuple[torch.Tensor, dict[int, torch.Tensor]]


class LastQueryArgmax(Reducer):
    """Keeps, per layer, the argmax key of each head at each sequence's last real query."""

    wants = frozenset({"pattern"})

    def __init__(self):
        self.layers = None
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [batch, head]

    def update(self, layer, batch, pattern=None, z=None):
        last = batch.mask.sum(-1) - 1  # [batch]
        rows = pattern[torch.arange(pattern.shape[0]), :, last.to(pattern.device)]  # [batch, head, k_pos]
        self.keys[layer] = rows.argmax(-1).cpu()  # [batch, head]


def retrieval_scores(model, prompts: Sequence, progress: bool = False, cache: bool | None = None) -> dict:
    """Greedy-decode every needle prompt and score copy-paste per head (Wu et al. 2024).

    `prompts`: NeedlePrompt tuples (probes.needle_prompts). Returns `score` [n_layers, n_heads]
    (NaN when no test was retrieved), `std` across retrieved tests, `per_test` [retrieved test, n_layers,
    n_heads] (each retrieved test's copy-paste share; absent when none), `n_tests`, `n_retrieved`,
    `n_tokens` (asked-for tokens of the retrieved tests). Tests of equal prompt length decode
    together as one batch. `cache` (default: on for Hugging Face models, off for a bridge):
    prefill once and decode with the key/value cache; off, one full forward per token.
    """
    n_layers, n_heads = n_layers_of(model), n_heads_of(model)
    cache = not is_bridge(model) if cache is None else cache
    groups: dict[tuple[int, int], list] = {}
    for test in prompts:
        groups.setdefault((len(test.prompt), len(test.needle) - test.restate), []).append(test)
    mine = list(distributed.shard(enumerate(groups.values())))  # this process's groups (all, alone)
    iterator = tqdm(mine, desc="needles", unit="batch", leave=False) if progress else mine
    retrieved = []  # ((group, test), asked, hits [layer, head]) of the retrieved tests
    with torch.no_grad():
        for index, group in iterator:
            ids = torch.tensor([test.prompt for test in group])  # [test, pos]
            n_steps = len(group[0].needle) - group[0].restate
            steps = decode_cached(model, ids, n_steps) if cache else decode_uncached(model, ids, n_steps)
            hits, correct = count_copy_paste(group, steps, n_layers, n_heads)
            for position, (test, test_hits, test_correct) in enumerate(zip(group, hits, correct, strict=True)):
                asked = len(test.needle) - test.restate
                if test_correct / asked > RETRIEVED_RECALL:
                    retrieved.append(((index, position), asked, test_hits))
    retrieved = sorted(item for part in distributed.all_gather(retrieved) for item in part)
    per_test = [hits.double() / asked for _, asked, hits in retrieved]
    n_tokens = sum(asked for _, asked, _ in retrieved)
    if not per_test:
        nan = torch.full((n_layers, n_heads), float("nan"))
        return {"score": nan, "std": nan, "n_tests": len(prompts), "n_retrieved": 0, "n_tokens": 0}
    stacked = torch.stack(per_test)  # [test, layer, head]
    return {
        "score": stacked.mean(0).float(),
        "std": stacked.std(0, unbiased=False).float(),
        "per_test": stacked,
        "n_tests": len(prompts),
        "n_retrieved": len(per_test),
        "n_tokens": n_tokens,
    }


def count_copy_paste(group, steps: Iterator[Step], n_layers: int, n_heads: int) -> tuple[torch.Tensor, list[int]]:
    """Copy-paste counts [test, n_layers, n_heads] of equal-length tests decoded as `steps`, and
    how many asked-for tokens each test generated in place."""
    ids = torch.tensor([test.prompt for test in group])  # [test, pos]
    start = torch.tensor([test.needle_start for test in group])  # [test]
    needles = torch.tensor([test.needle for test in group])  # [test, needle_len]
    restate = group[0].restate
    hits = torch.zeros(len(group), n_layers, n_heads, dtype=torch.long)  # [test, layer, head]
    correct = torch.zeros(len(group), dtype=torch.long)  # [test]
    for step, (w, keys_by_layer) in enumerate(steps):
        correct += (w == needles[:, restate + step]).long()
        in_needle = (needles == w[:, None]).any(-1)  # [test] w is a needle token
        for layer, keys in keys_by_layer.items():  # keys [test, head]
            inside = (keys >= start[:, None]) & (keys < start[:, None] + needles.shape[1])  # [test, head]
            same = ids.gather(1, keys) == w[:, None]  # [test, head]
            hits[:, layer] += (inside & same & in_needle[:, None]).long()
        ids = torch.cat([ids, w[:, None]], dim=1)  # [test, pos + 1]
    return hits, correct.tolist()


def decode_uncached(model, ids: torch.Tensor, n_steps: int) -> Iterator[Step]:
    """Greedy decoding of `ids` [test, pos] with one full forward per token (works on a bridge)."""
    reducer = LastQueryArgmax()
    with capture_hooks(model, [reducer], check=False) as hooks:
        for _ in range(n_steps):
            batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))
            hooks.batch = batch
            if is_bridge(model):
                w = forward(model, batch)[:, -1].argmax(-1).cpu()  # [test]
            else:
                w = _next_tokens(model, input_ids=ids)  # [test]
            yield w, dict(reducer.keys)
            ids = torch.cat([ids, w[:, None]], dim=1)  # [test, pos + 1]


def decode_cached(model, ids: torch.Tensor, n_steps: int) -> Iterator[Step]:
    """Greedy decoding of `ids` [test, pos] with the key/value cache (Hugging Face models).

    1) prefill: sdpa forward over the prompt; each layer's last-query row is rebuilt from its
       own Q and K; 2) decode: one token per step, eager attention, the new token's row read
       from each attention module's output.
    """
    from transformers import DynamicCache

    adapter = adapter_for(model)
    kv = DynamicCache()  # full-length layers: a sliding-window model masks, the cache keeps every key
    keys: dict[int, torch.Tensor] = {}
    with attention_implementation(model, NO_PATTERN), adapter.hooks() as hooks:
        for layer in range(adapter.n_layers):
            hooks.qkv(layer, _last_row(adapter, layer, keys))
        w = _next_tokens(model, input_ids=ids, cache=kv, use_cache=True)  # [test]
    yield w, dict(keys)
    n_keys: dict[int, int] = {}
    with adapter.hooks() as hooks:
        for layer in range(adapter.n_layers):
            hooks.output(adapter.attn(layer), _new_row(layer, keys, n_keys))
        for step in range(1, n_steps):
            w = _next_tokens(model, input_ids=w[:, None], cache=kv, use_cache=True)  # [test]
            spans = {int(n_keys[layer]) for layer in range(adapter.n_layers)}
            if spans != {ids.shape[1] + step}:  # a sliding-window cache keeps fewer keys than positions
                raise CaptureError(
                    f"the cached attention rows span {sorted(spans)} keys, not the whole sequence "
                    f"({ids.shape[1] + step}): decode with cache=False"
                )
            yield w, dict(keys)


def _last_row(adapter, layer: int, keys: dict):
    """fn(q, k, v) for `Hooks.qkv`: the argmax key of the last query row (rebuilt with
    mha.pattern_rows from the layer's own Q and K) into `keys[layer]` [batch, head]."""
    scale, window = adapter.attention_scale(layer), adapter.sliding_window(layer)

    def on_qkv(q, k, v):
        pos = q.shape[2]
        mask = torch.ones(q.shape[0], pos, dtype=torch.bool, device=q.device)  # [batch, pos]
        row = pattern_rows(q, k, mask, scale, pos - 1, pos, window)  # [batch, head, 1, k_pos]
        keys[layer] = row[:, :, 0].argmax(-1).cpu()  # [batch, head]

    return on_qkv


def _new_row(layer: int, keys: dict, n_keys: dict):
    """fn(output) for `Hooks.output` on an eager attention module: the new query's argmax key
    [batch, head] into `keys[layer]`, the number of keys its row spans into `n_keys[layer]`."""

    def on_output(output):
        pattern = attention_pattern(output)  # [batch, head, 1, k_pos]
        keys[layer] = pattern[:, :, -1].argmax(-1).cpu()  # [batch, head]
        n_keys[layer] = pattern.shape[-1]

    return on_output


def _next_tokens(model, **inputs) -> torch.Tensor:
    """Greedy next token of each row of a Hugging Face causal LM: the argmax of its last position's
    logits, [batch] (on the CPU). The trunk runs as the model's own (`base_model`, final norm
    included); the LM head is applied here as W_U @ h^T to the last positions only: for a few rows
    against a large vocabulary, MKL is slower at h @ W_U^T than at W_U @ h^T (BENCHMARKS.md). A logit
    softcap (tanh) keeps the argmax, so it is left out."""
    device = next(model.parameters()).device
    inputs["input_ids"] = inputs["input_ids"].to(device)
    hidden = model.base_model(**inputs).last_hidden_state[:, -1]  # [batch, d_model]
    head = adapter_for(model).unembed()  # the site table's LM head
    logits = (head.weight @ hidden.T).T  # [batch, d_vocab]
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias
    return logits.argmax(-1).cpu()  # [batch]
