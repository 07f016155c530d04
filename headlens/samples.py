"""Attention patterns of one short sample, for the report's viewer and thumbnails.

The report shows, for every head, where each token of a sample looks. That needs full
patterns, so the sample is capped at `max_tokens` (GPT-2 small: 12 x 12 heads x 64 x 64 floats,
~2.4 MB in float32) and captured in one forward pass through the streaming hooks of
`headlens.capture`.

A repeated sample is chosen so that induction heads do on it what the caption says
(`choose_repeated`): the start of the text twice when the model copies repeated text, else a
segment of seeded random tokens twice, the probe classify finds induction heads on (Olsson et
al. 2022). Whether the model copies the text is measured, not assumed: its own loss on the
second copy against the first.
"""

from __future__ import annotations

import torch

from headlens.capture import Batch, Reducer, run_capture
from headlens.errors import ConfigError, InputTextError
from headlens.probes import check_text, random_token_range, repeated_random_tokens

# Below two tokens there is no attention to show (a lone BOS attends to itself).
MIN_SAMPLE_TOKENS = 2
# The model copies a repeated text when its mean next-token loss on the second copy is at most this share of
# the first copy's. No published cut-off: in-context copying is the drop of loss on repeated tokens (Olsson et
# al. 2022's induction and ICL measures). On the report's default sample (the held-out text's start) SmolLM2-135M's
# second-copy loss is 0.19 of the first's (0.60 vs 3.21 nats, 22-token copies); tiny's is 1.02 of it (1.51 vs
# 1.49, 127-byte copies): tiny copies random bytes, not text.
COPY_LOSS_RATIO = 0.5
# Values of the sample's `sample` key: what the repeated segment is.
SAMPLE_TEXT = "text"  # the text as given (or its start twice)
SAMPLE_RANDOM = "random_tokens"  # seeded random tokens twice (headlens.probes.repeated_random_tokens)


class _KeepPatterns(Reducer):
    """Keeps the pattern of the single sequence of a one-batch run, layer by layer."""

    wants = frozenset({"pattern"})

    def __init__(self) -> None:
        self.patterns: dict[int, torch.Tensor] = {}

    def update(self, layer, batch, pattern=None, z=None):
        self.patterns[layer] = pattern[0].detach().float().cpu().clone()  # [head, q_pos, k_pos]


def copy_losses(loaded, ids: list[int], period: int) -> tuple[float, float]:
    """Mean next-token loss (nats) on the first and on the second copy of `ids` = BOS + segment + segment,
    `period` tokens per copy; each copy's first token is left out (nothing before it predicts it)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=next(loaded.model.parameters()).device)  # [1, pos]
    with torch.no_grad():
        logits = loaded.model(input_ids).logits[0, :-1].float()  # [pos-1, d_vocab]
    losses = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:], reduction="none")  # [pos-1]
    # losses[t] is the loss of token t + 1: the first copy holds tokens 1..period, the second period+1..2*period
    return float(losses[1:period].mean()), float(losses[period + 1 : 2 * period].mean())


def choose_repeated(loaded, body: list[int], limit: int, seed: int = 0) -> dict:
    """The repeated sample of at most `limit` tokens (BOS first): `ids`, `sample` (SAMPLE_TEXT or
    SAMPLE_RANDOM) and the model's `copy_loss` ([first copy, second copy] on the repeated text)."""
    period = max(1, (limit - 1) // 2)
    text_ids = [loaded.bos_token_id] + body[:period] * 2
    period = (len(text_ids) - 1) // 2
    first, second = copy_losses(loaded, text_ids, period) if period >= 2 else (float("nan"), float("nan"))
    if period >= 2 and second <= COPY_LOSS_RATIO * first:
        return {"ids": text_ids, "sample": SAMPLE_TEXT, "copy_loss": [first, second]}
    low, high = random_token_range(loaded.spec.d_vocab)
    tokens = repeated_random_tokens(1, max(1, (limit - 1) // 2), 2, low, high, loaded.bos_token_id, seed=seed)
    return {"ids": tokens[0].tolist(), "sample": SAMPLE_RANDOM, "copy_loss": [first, second]}


def sample_patterns(loaded, text: str, max_tokens: int = 64, *, repeat: bool = False, seed: int = 0) -> dict:
    """Tokenize `text` (BOS first), keep the first `max_tokens` tokens, capture every head's pattern.

    With `repeat=True` the sample is a segment of (max_tokens - 1) // 2 tokens, twice (choose_repeated):
    the text's start when the model copies it, else seeded random tokens (`seed`). On the second copy
    induction heads attend to the token after the earlier occurrence (Olsson et al. 2022's
    repeated-sequence probe), so their pattern shows in a thumbnail.

    Returns a dict:
    - `tokens`: list[str], each token decoded on its own (BOS included, as the model sees it);
    - `ids`: list[int], the token ids the model read;
    - `patterns`: float tensor [n_layers, n_heads, pos, pos] (post-softmax, rows sum to 1);
    - `n_tokens_total`: tokens the whole text has (BOS included), so callers can say it was cut;
    - `text`: the text itself, or with a repeated text the repeated sample (the report quotes its start);
    - `repeated`: whether the sample is a repeated segment;
    - `sample`: SAMPLE_TEXT or SAMPLE_RANDOM, and with `repeat` `copy_loss`: the model's mean loss on the
      first and second copy of the repeated text.
    """
    if not isinstance(max_tokens, int) or max_tokens < MIN_SAMPLE_TOKENS:
        raise ConfigError(f"max_tokens must be an integer >= {MIN_SAMPLE_TOKENS}, got {max_tokens!r}")
    text = check_text(text, "sample text")
    tokenizer = loaded.tokenizer
    body = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not body:
        raise InputTextError("sample text has no tokens")
    limit = min(max_tokens, loaded.spec.n_ctx)
    chosen = (
        choose_repeated(loaded, body, limit, seed)
        if repeat
        else {"ids": [loaded.bos_token_id] + body, "sample": SAMPLE_TEXT}
    )
    kept = chosen["ids"][:limit]
    input_ids = torch.tensor([kept], dtype=torch.long)  # [1, pos]
    mask = torch.ones_like(input_ids, dtype=torch.bool)  # [1, pos]
    keeper = _KeepPatterns()
    run_capture(loaded.model, [Batch(input_ids, mask)], [keeper])
    patterns = torch.stack([keeper.patterns[layer] for layer in range(loaded.spec.n_layers)])  # [layer, head, q, k]
    out = {
        "tokens": [tokenizer.decode([token]) for token in kept],
        "ids": kept,
        "patterns": patterns,
        "n_tokens_total": len(body) + 1,
        "text": tokenizer.decode(kept[1:]) if repeat and chosen["sample"] == SAMPLE_TEXT else text,
        "repeated": repeat,
        "sample": chosen["sample"],
    }
    if repeat:
        out["copy_loss"] = chosen["copy_loss"]
    return out
