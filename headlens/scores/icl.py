"""In-context learning and induction measured by loss and attention on probes.

- ICL score (Olsson et al. 2022, arXiv 2209.11895, "In-context Learning and Induction Heads"):
  loss at the 500th token minus loss at the 50th token of natural text, in nats; it falls
  (more negative) when induction heads form. Our contexts are shorter (the tiny model has
  n_ctx 256), so both positions are scaled by n_ctx / 512 keeping Olsson's 10:1 ratio
  (see `icl_positions`), and each position is a small band of tokens to cut noise.
- Repeated random tokens [BOS, c, c] (TransformerLens `evals.induction_loss`): the loss on
  the second copy c is far below the loss on the first copy once induction heads copy.
- Second-copy induction score: attention from each second-copy token to the prefix-matching
  targets (the tokens that followed earlier occurrences of the query token; Olsson et al.),
  i.e. headlens's prefix-matching score restricted to queries in the second copy.
"""

from __future__ import annotations

import math

import torch

from headlens.scores.common import TargetMassReducer
from headlens.scores.induction import prefix_matching_targets

# Olsson et al. compare token 500 with token 50 (of a 512-token window at least): 10:1.
OLSSON_LATE, OLSSON_EARLY, OLSSON_CTX = 500, 50, 512
# Tokens on each side of a position averaged into its loss (a band of 2 * 5 + 1 tokens).
ICL_BAND = 5


def icl_positions(n_ctx: int) -> tuple[int, int]:
    """(early, late) token positions scaled to a context of n_ctx tokens (Olsson: 50, 500 of 512)."""
    late = min(n_ctx - 1 - ICL_BAND, round(OLSSON_LATE * n_ctx / OLSSON_CTX))
    early = max(ICL_BAND + 1, round(OLSSON_EARLY * n_ctx / OLSSON_CTX))
    return early, late


def icl_score(losses: torch.Tensor, n_ctx: int) -> float:
    """Loss late in context minus loss early (nats); negative = the model learns in context.

    losses: [batch, pos - 1] from `headlens.intervene.metrics.token_losses` (index t = loss of token t + 1),
    NaN on padding; windows should be full length. Token positions count BOS as position 0.
    """
    early, late = icl_positions(n_ctx)

    def band_mean(pos: int) -> float:
        cols = losses[:, pos - 1 - ICL_BAND : pos + ICL_BAND]  # [batch, 2 * band + 1]: tokens pos-band..pos+band
        return float(torch.nanmean(cols.double()))

    value = band_mean(late) - band_mean(early)
    return value if not math.isnan(value) else float("nan")


def copy_losses(losses: torch.Tensor, seq_len: int) -> tuple[float, float]:
    """Mean loss on the first and on the second copy of [BOS, c, c] sequences (nats).

    losses: [batch, 2 * seq_len] from `token_losses` on [batch, 1 + 2 * seq_len] ids. The first
    token of each copy is left out: nothing in context predicts it (for the second copy it
    follows the last token of the first copy).
    """
    first = losses[:, 1:seq_len]  # [batch, seq_len - 1]: tokens 2..seq_len
    second = losses[:, seq_len + 1 : 2 * seq_len]  # [batch, seq_len - 1]: tokens seq_len + 2..2 * seq_len
    return float(first.double().mean()), float(second.double().mean())


def second_copy_queries(input_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[batch, q_pos] bool: True on the second copy of [BOS, c, c] (positions 1 + seq_len ..)."""
    queries = torch.zeros(input_ids.shape, dtype=torch.bool)  # [batch, q_pos]
    queries[:, 1 + seq_len :] = True
    return queries


def second_copy_induction_reducer(n_layers: int, n_heads: int, seq_len: int, layers=None) -> TargetMassReducer:
    """Reducer: mean attention mass from second-copy queries on their prefix-matching targets.

    On [BOS, c, c] each second-copy token's targets include the token after its earlier
    occurrence in the first copy (plus, where c repeats a token, the tokens after those).
    `result()` is [n_layers, n_heads] in 0..1.
    """
    return TargetMassReducer(
        n_layers,
        n_heads,
        lambda b: prefix_matching_targets(b.input_ids),
        query_fn=lambda b: second_copy_queries(b.input_ids, seq_len),
        layers=layers,
    )
