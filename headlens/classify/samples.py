"""Attention patterns of one short sample, for the report's viewer and thumbnails.

The report shows, for every head, where each token of a sample looks. That needs full
patterns, so the sample is capped at `max_tokens` (GPT-2 small: 12 x 12 heads x 64 x 64 floats,
~2.4 MB in float32) and captured in one forward pass through the streaming hooks of
`headlens.capture`.

A repeated sample is chosen so that induction heads do on it what the caption says
(`choose_repeated`): the start of the text twice when the model copies repeated text and the
heads labelled induction (when given) prefix-match on it, else a segment of seeded random tokens
twice, the probe classify finds induction heads on (Olsson et al. 2022). Both are measured, not
assumed: the model's own loss on the second copy against the first, and each labelled head's
prefix-matching score on the sample (classify's score, headlens.scores.induction, against
classify's threshold for it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from headlens.capture import Batch, Reducer, run_capture
from headlens.classify.labels import ClassifyConfig
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head
from headlens.probes.inputs import (
    check_text,
    random_token_range,
    repeated_random_tokens,
)
from headlens.probes.tokenize import decode, decode_each, token_ids, token_pieces
from headlens.results import Result
from headlens.scores.induction import prefix_matching_targets

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

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
SAMPLE_RANDOM = "random_tokens"  # seeded random tokens twice (headlens.probes.inputs.repeated_random_tokens)
# A labelled induction head does induction on a sample when its prefix-matching score there reaches the
# threshold that labelled it (Olsson et al. 2022's prefix matching; classify's default).
PREFIX_MATCHING_MIN = ClassifyConfig().prefix_matching_min


class _KeepPatterns(Reducer):
    """Keeps the pattern of the single sequence of a one-batch run, layer by layer."""

    wants = frozenset({"pattern"})

    def __init__(self) -> None:
        self.patterns: dict[int, torch.Tensor] = {}

    def update(self, layer, batch, pattern=None, z=None):
        self.patterns[layer] = pattern[0].detach().float().cpu().clone()  # [head, q_pos, k_pos]


def copy_losses(loaded: LoadedModel, ids: list[int], period: int) -> tuple[float, float]:
    """Mean next-token loss (nats) on the first and on the second copy of `ids` = BOS + segment + segment,
    `period` tokens per copy; each copy's first token is left out (nothing before it predicts it)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=next(loaded.model.parameters()).device)  # [1, pos]
    with torch.no_grad():
        logits = loaded.model(input_ids).logits[0, :-1].float()  # [pos-1, d_vocab]
    losses = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:], reduction="none")  # [pos-1]
    # losses[t] is the loss of token t + 1: the first copy holds tokens 1..period, the second period+1..2*period
    return float(losses[1:period].mean()), float(losses[period + 1 : 2 * period].mean())


def choose_repeated(loaded: LoadedModel, body: list[int], limit: int, seed: int = 0) -> dict:
    """The repeated sample of at most `limit` tokens (BOS first): `ids`, `sample` (SAMPLE_TEXT or
    SAMPLE_RANDOM) and the model's `copy_loss` ([first copy, second copy] on the repeated text)."""
    period = max(1, (limit - 1) // 2)
    text_ids = [loaded.bos_token_id] + body[:period] * 2
    period = (len(text_ids) - 1) // 2
    first, second = copy_losses(loaded, text_ids, period) if period >= 2 else (float("nan"), float("nan"))
    if period >= 2 and second <= COPY_LOSS_RATIO * first:
        return {"ids": text_ids, "sample": SAMPLE_TEXT, "copy_loss": [first, second]}
    return {"ids": random_repeat(loaded, limit, seed), "sample": SAMPLE_RANDOM, "copy_loss": [first, second]}


def prefix_matching(patterns: torch.Tensor, ids: list[int], heads: list[Head]) -> dict[Head, float]:
    """Each head's mean attention mass on prefix-matching targets (the key after an earlier occurrence of
    the query's token) over the queries that have one: classify's prefix-matching score on one sample.
    patterns [layer, head, q, k]."""
    targets = prefix_matching_targets(torch.tensor([ids]))[0]  # [q, k]
    scored = targets.any(-1)  # [q]
    if not bool(scored.any()):
        return {head: 0.0 for head in heads}
    mass = (patterns * targets).sum(-1)[..., scored].mean(-1)  # [layer, head]
    return {head: float(mass[head.layer, head.head]) for head in heads}


def capture_patterns(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Every head's pattern on one sequence: [layer, head, q, k] float32."""
    input_ids = torch.tensor([ids], dtype=torch.long)  # [1, pos]
    keeper = _KeepPatterns()
    run_capture(loaded.model, [Batch(input_ids, torch.ones_like(input_ids, dtype=torch.bool))], [keeper])
    return torch.stack([keeper.patterns[layer] for layer in range(loaded.spec.n_layers)])  # [layer, head, q, k]


def random_repeat(loaded: LoadedModel, limit: int, seed: int) -> list[int]:
    """BOS, then (limit - 1) // 2 seeded random tokens twice."""
    low, high = random_token_range(loaded.spec.d_vocab)
    tokens = repeated_random_tokens(1, max(1, (limit - 1) // 2), 2, low, high, loaded.bos_token_id, seed=seed)
    return tokens[0].tolist()


def sample_patterns(
    loaded: LoadedModel, text: str, max_tokens: int = 64, *, repeat: bool = False, seed: int = 0, induction_heads=None
) -> Result:
    """Tokenize `text` (BOS first), keep the first `max_tokens` tokens, capture every head's pattern.

    With `repeat=True` the sample is a segment of (max_tokens - 1) // 2 tokens, twice (choose_repeated):
    the text's start when the model copies it and every head of `induction_heads` (heads labelled
    induction) prefix-matches on it (score >= PREFIX_MATCHING_MIN), else seeded random tokens (`seed`).
    On the second copy induction heads attend to the token after the earlier occurrence (Olsson et al. 2022's
    repeated-sequence probe), so their pattern shows in a thumbnail.

    Returns a Result of kind "sample" (sample_result): `.frame` one row per position (`pos`; `token`, each
    token decoded on its own, BOS included, as the model sees it; `id`, the token id the model read),
    `.tables["patterns"]` every head's pattern (post-softmax, rows sum to 1; `patterns_of` gives it back as
    [n_layers, n_heads, pos, pos]), and `.meta`:
    - `n_layers`, `n_heads`: the patterns' shape;
    - `n_tokens_total`: tokens the whole text has (BOS included), so callers can say it was cut;
    - `text`: the text itself, or with a repeated text the repeated sample (the report quotes its start);
    - `repeated`: whether the sample is a repeated segment;
    - `sample`: SAMPLE_TEXT or SAMPLE_RANDOM, and with `repeat` `copy_loss`: the model's mean loss on the
      first and second copy of the repeated text;
    - with `repeat` and `induction_heads`: `prefix_matching` ({"L.H": score} on the sample shown) and, when
      the text was set aside for random tokens, `text_prefix_matching` (the scores on the text).
    """
    if not isinstance(max_tokens, int) or max_tokens < MIN_SAMPLE_TOKENS:
        raise ConfigError(f"max_tokens must be an integer >= {MIN_SAMPLE_TOKENS}, got {max_tokens!r}")
    text = check_text(text, "sample text")
    tokenizer = loaded.tokenizer
    limit = min(max_tokens, loaded.spec.n_ctx)
    body, cut = token_ids(tokenizer, text, limit)  # a long text: tokenized piece by piece, as far as shown
    total = sum(len(piece) for piece in token_pieces(tokenizer, text)) if cut else len(body)  # counted, not kept
    if not body:
        raise InputTextError("sample text has no tokens")
    chosen = (
        choose_repeated(loaded, body, limit, seed)
        if repeat
        else {"ids": [loaded.bos_token_id] + body, "sample": SAMPLE_TEXT}
    )
    kept = chosen["ids"][:limit]
    patterns = capture_patterns(loaded, kept)  # [layer, head, q, k]
    heads = sorted(Head(*h) for h in induction_heads or [])
    if repeat and heads:
        chosen["prefix_matching"] = prefix_matching(patterns, kept, heads)
        if chosen["sample"] == SAMPLE_TEXT and min(chosen["prefix_matching"].values()) < PREFIX_MATCHING_MIN:
            kept = random_repeat(loaded, limit, seed)  # the heads do not prefix-match on the text: the probe's sample
            patterns = capture_patterns(loaded, kept)  # [layer, head, q, k]
            text_scores = chosen["prefix_matching"]
            chosen = {**chosen, "sample": SAMPLE_RANDOM, "text_prefix_matching": text_scores}
            chosen["prefix_matching"] = prefix_matching(patterns, kept, heads)
    facts = {
        "n_tokens_total": total + 1,
        "text": decode(tokenizer, kept[1:]) if repeat and chosen["sample"] == SAMPLE_TEXT else text,
        "repeated": repeat,
        "sample": chosen["sample"],
    }
    if repeat:
        facts["copy_loss"] = [float(loss) for loss in chosen["copy_loss"]]
    for key in ("prefix_matching", "text_prefix_matching"):
        if key in chosen:
            facts[key] = {str(head): score for head, score in chosen[key].items()}
    return sample_result(decode_each(tokenizer, kept), patterns, ids=kept, **facts)


def sample_result(tokens: list[str], patterns, ids: list[int] | None = None, **facts) -> Result:
    """A viewer sample as a Result of kind "sample": `tokens` (one string per position), their `patterns`
    [n_layers, n_heads, pos, pos] (a tensor or an array), the token `ids` when known, and `facts` for the meta
    (sample_patterns lists them). `.tables["patterns"]` holds one row per layer, head, q_pos and k_pos, in that
    order, with its `pattern` weight. ValueError when the patterns do not match the tokens."""
    weights = torch.as_tensor(np.asarray(patterns), dtype=torch.float32)  # [layer, head, q_pos, k_pos]
    if weights.dim() != 4 or weights.shape[2] != weights.shape[3] or weights.shape[3] != len(tokens):
        raise ValueError(f"sample patterns {tuple(weights.shape)} do not match {len(tokens)} tokens")
    grid = np.indices(tuple(weights.shape)).reshape(4, -1)  # [4, layer * head * q_pos * k_pos]
    columns = {name: grid[i].astype(np.int32) for i, name in enumerate(("layer", "head", "q_pos", "k_pos"))}
    table = pd.DataFrame({**columns, "pattern": weights.reshape(-1).numpy()})  # [layer * head * q_pos * k_pos]
    frame = pd.DataFrame({"pos": range(len(tokens)), "token": [str(token) for token in tokens]})
    if ids is not None:
        frame["id"] = [int(i) for i in ids]
    meta = {"n_layers": int(weights.shape[0]), "n_heads": int(weights.shape[1]), **facts}
    return Result("sample", frame, meta, tables={"patterns": table})


def patterns_of(sample: Result) -> torch.Tensor:
    """A sample Result's patterns [n_layers, n_heads, pos, pos] float32 (sample_result's table, in its order)."""
    n = len(sample.frame)
    weights = sample.tables["patterns"]["pattern"].to_numpy(dtype=np.float32)  # [layer * head * q_pos * k_pos]
    return torch.from_numpy(weights.copy()).reshape(sample.meta["n_layers"], sample.meta["n_heads"], n, n)
