"""Retrieval heads (Wu et al. 2024, arXiv 2404.15574): heads that copy-paste a needle.

During greedy decoding of a needle-in-a-haystack test, at each step with generated token w,
head h *copy-pastes* if (1) w is a needle token and (2) h's argmax key j lies inside the
needle span with token[j] == w. retrieval_score(h) = copy-pasted tokens / tokens asked for,
averaged over the tests the model gets right (Wu et al. count a test only when the answer is
retrieved, ROUGE-1 recall > 50%; here: > 50% of the asked-for needle tokens generated in
place). Wu et al. call a head a retrieval head above 0.1. The prompts are adapted to small
GPT-2 contexts in `headlens.probes.needle_prompts`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from headlens.capture import Batch, Reducer, capture_hooks, forward, is_bridge, n_heads_of, n_layers_of

# Wu et al.: a test counts when the answer is retrieved (ROUGE-1 recall > 50%).
RETRIEVED_RECALL = 0.5


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


def retrieval_scores(model, prompts: Sequence, progress: bool = False) -> dict:
    """Greedy-decode every needle prompt and score copy-paste per head (Wu et al. 2024).

    `prompts`: NeedlePrompt tuples (probes.needle_prompts). Returns `score` [n_layers, n_heads]
    (NaN when no test was retrieved), `std` across retrieved tests, `n_tests`, `n_retrieved`,
    `n_tokens` (asked-for tokens of the retrieved tests). Tests of equal prompt length decode
    together as one batch; one full forward per generated token (no KV cache), so it also runs
    on a TransformerBridge.
    """
    n_layers, n_heads = n_layers_of(model), n_heads_of(model)
    groups: dict[tuple[int, int], list] = {}
    for test in prompts:
        groups.setdefault((len(test.prompt), len(test.needle) - test.restate), []).append(test)
    iterator = list(groups.values())
    if progress:

        iterator = tqdm(iterator, desc="needles", unit="batch", leave=False)
    per_test, n_tokens = [], 0
    reducer = LastQueryArgmax()
    batch_ref: list = [None]
    with torch.no_grad(), capture_hooks(model, [reducer], batch_ref, check=False):
        for group in iterator:
            hits, correct = _decode_group(model, group, reducer, batch_ref, n_layers, n_heads)
            for test, test_hits, test_correct in zip(group, hits, correct, strict=True):
                asked = len(test.needle) - test.restate
                if test_correct / asked > RETRIEVED_RECALL:
                    per_test.append(test_hits.double() / asked)
                    n_tokens += asked
    if not per_test:
        nan = torch.full((n_layers, n_heads), float("nan"))
        return {"score": nan, "std": nan, "n_tests": len(prompts), "n_retrieved": 0, "n_tokens": 0}
    stacked = torch.stack(per_test)  # [test, layer, head]
    return {"score": stacked.mean(0).float(), "std": stacked.std(0, unbiased=False).float(),
            "n_tests": len(prompts), "n_retrieved": len(per_test), "n_tokens": n_tokens}


def _next_tokens(model, batch: Batch) -> torch.Tensor:
    """Greedy next token of each (unpadded) row: [batch]."""
    if is_bridge(model):
        return forward(model, batch)[:, -1].argmax(-1).cpu()
    ids = batch.input_ids.to(next(model.parameters()).device)
    return model(input_ids=ids, logits_to_keep=1).logits[:, -1].argmax(-1).cpu()  # [batch]


def _decode_group(model, group, reducer, batch_ref, n_layers, n_heads) -> tuple[torch.Tensor, list[int]]:
    """Greedy decoding of equal-length tests: copy-paste counts [test, n_layers, n_heads] and
    how many asked-for tokens each test generated in place."""
    ids = torch.tensor([test.prompt for test in group])  # [test, pos]
    start = torch.tensor([test.needle_start for test in group])  # [test]
    needles = torch.tensor([test.needle for test in group])  # [test, needle_len]
    restate = group[0].restate
    hits = torch.zeros(len(group), n_layers, n_heads, dtype=torch.long)  # [test, layer, head]
    correct = torch.zeros(len(group), dtype=torch.long)  # [test]
    for step in range(needles.shape[1] - restate):
        batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))
        batch_ref[0] = batch
        w = _next_tokens(model, batch)  # [test]
        correct += (w == needles[:, restate + step]).long()
        in_needle = (needles == w[:, None]).any(-1)  # [test] w is a needle token
        for layer, keys in reducer.keys.items():  # keys [test, head]
            inside = (keys >= start[:, None]) & (keys < start[:, None] + needles.shape[1])  # [test, head]
            same = ids.gather(1, keys) == w[:, None]  # [test, head]
            hits[:, layer] += (inside & same & in_needle[:, None]).long()
        ids = torch.cat([ids, w[:, None]], dim=1)  # [test, pos + 1]
    return hits, correct.tolist()
