"""Attention patterns of one short sample text, for the report's viewer and thumbnails.

The report shows, for every head, where each token of a sample looks. That needs full
patterns, so the text is capped at `max_tokens` (GPT-2 small: 12 x 12 heads x 64 x 64 floats,
~2.4 MB in float32) and captured in one forward pass through the streaming hooks of
`headlens.capture`.
"""

from __future__ import annotations

import torch

from headlens.capture import Batch, Reducer, run_capture
from headlens.errors import ConfigError, InputTextError
from headlens.probes import check_text

# Below two tokens there is no attention to show (a lone BOS attends to itself).
MIN_SAMPLE_TOKENS = 2


class _KeepPatterns(Reducer):
    """Keeps the pattern of the single sequence of a one-batch run, layer by layer."""

    wants = frozenset({"pattern"})

    def __init__(self) -> None:
        self.patterns: dict[int, torch.Tensor] = {}

    def update(self, layer, batch, pattern=None, z=None):
        self.patterns[layer] = pattern[0].detach().float().cpu().clone()  # [head, q_pos, k_pos]


def sample_patterns(loaded, text: str, max_tokens: int = 64, *, repeat: bool = False) -> dict:
    """Tokenize `text` (BOS first), keep the first `max_tokens` tokens, capture every head's pattern.

    With `repeat=True` the sample is BOS + the first (max_tokens - 1) // 2 text tokens, twice: on the
    second copy induction heads attend to the token after the earlier occurrence (Olsson et al. 2022's
    repeated-sequence probe), so their pattern shows in a thumbnail.

    Returns a dict:
    - `tokens`: list[str], each token decoded on its own (BOS included, as the model sees it);
    - `patterns`: float tensor [n_layers, n_heads, pos, pos] (post-softmax, rows sum to 1);
    - `n_tokens_total`: tokens the whole text has (BOS included), so callers can say it was cut;
    - `text`: the text itself, or with `repeat` the repeated sample (the report quotes its start);
    - `repeated`: whether the sample is a repeated segment.
    """
    if not isinstance(max_tokens, int) or max_tokens < MIN_SAMPLE_TOKENS:
        raise ConfigError(f"max_tokens must be an integer >= {MIN_SAMPLE_TOKENS}, got {max_tokens!r}")
    text = check_text(text, "sample text")
    tokenizer = loaded.tokenizer
    body = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not body:
        raise InputTextError("sample text has no tokens")
    limit = min(max_tokens, loaded.spec.n_ctx)
    if repeat:
        half = body[: max(1, (limit - 1) // 2)]
        body = half + half
    ids = [loaded.bos_token_id] + body
    kept = ids[:limit]
    input_ids = torch.tensor([kept], dtype=torch.long)  # [1, pos]
    mask = torch.ones_like(input_ids, dtype=torch.bool)  # [1, pos]
    keeper = _KeepPatterns()
    run_capture(loaded.model, [Batch(input_ids, mask)], [keeper])
    patterns = torch.stack([keeper.patterns[layer] for layer in range(loaded.spec.n_layers)])  # [layer, head, q, k]
    return {
        "tokens": [tokenizer.decode([token]) for token in kept],
        "patterns": patterns,
        "n_tokens_total": len(ids),
        "text": tokenizer.decode(kept[1:]) if repeat else text,
        "repeated": repeat,
    }
