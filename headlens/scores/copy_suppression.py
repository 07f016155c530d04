"""Copy-suppression (negative) heads: attend to the token the model predicts, and lower its logit.

McDougall et al. 2023, "Copy Suppression: Comprehensively Understanding an Attention Head"
(arXiv 2310.04625; GPT-2 small 10.7, also 11.10). Two parts, both measured:
- OV, negative copying through the full circuit W_U W_OV W_EE, over the vocabulary
  (headlens.scores.ov_vocab, the paper's W_EE): `cs_ov_score` = share of the vocabulary's tokens
  whose own logit ranks in the bottom BOTTOM_K = 10 of their column (a random map puts a token there
  with chance 10 / d_vocab); exact up to 2,401 tokens, else a seeded sample of the vocabulary with a
  95% interval of at most +-0.02;
- QK, on natural text: at query positions where the model's own top-1 prediction is the true
  next token and already occurs earlier in the context (the naive copying copy suppression acts
  on), `predicted_attention` = the head's attention mass on those earlier copies (mean over such
  positions; position 0, the BOS sink, is not a copy). Requiring a correct prediction keeps the
  positions where the model predicts from its context, not from a guess spread over it.
A head is a copy-suppression head when cs_ov_score >= CS_OV_MIN and predicted_attention >=
CS_ATTENTION_MIN. The paper fixes neither cut-off; ours: CS_OV_MIN = 0.5 (most tokens suppress
themselves, as for 10.7) and CS_ATTENTION_MIN = 0.3 (a third of the head's attention on the
predicted token's copies, where a head spreading attention evenly over a 64-token window puts
about 1/64 per copy).

What the attention part measures (SmolLM2, 16 windows of 64 tokens of the default text, 177 counted
positions): `predicted_attention` is a behavioural mean over every natural-text position whose final,
correct top-1 prediction occurs earlier, not McDougall et al.'s quantity. Their QK evidence is read
from the weights (the QK circuit with the unembedding of a predicted token as the query and W_EE as
the keys: does a token's own key rank first) and their behavioural examples are positions where
earlier layers predict a token strongly (IOI: 24.4 puts 0.61 of its attention on the indirect object
where the model predicts it). On natural text SmolLM2's 24.4 and 23.3 rest on the BOS sink (0.60 and
0.73 of their attention) and put 0.043 and 0.027 on the predicted token's copies; taking the
prediction from the logit lens at the head's input instead (any, wrong ones only, or confidence >= 0.9)
gives 0.015-0.022. So CS_ATTENTION_MIN = 0.3 on this probe is not the paper's criterion, and neither
head meets it although both meet the paper's OV criterion (24.4 0.578, 23.3 0.561 over the vocabulary);
the weights-based QK criterion is not measured here.

The classify probe (`probe_copy_suppression`, headlens.classify.kind_runs): the QK part reads windows
of the text probe's first tokens (its haystack, already tokenized), at most 2 x token_budget tokens;
the OV part's cost is fixed by the vocabulary (SmolLM2: ~1.4 TFLOP, 1.5-2 min on 2 loaded cores).
"""

from __future__ import annotations

import torch

from headlens.errors import InputTextError
from headlens.probes.inputs import text_windows
from headlens.scores.ov_vocab import BOTTOM_K, cs_ov_vocab

CS_OV_MIN = 0.5  # share of tokens (ours; see the module docstring)
CS_ATTENTION_MIN = 0.3  # attention mass on the predicted token's earlier copies (ours)
WINDOW = 64  # tokens per natural-text window (BOS included)
MAX_WINDOWS = 8


def negative_copy_share(below: torch.Tensor, k: int = BOTTOM_K) -> torch.Tensor:
    """Share of tokens whose own logit has fewer than k vocabulary tokens below it:
    below [..., n] -> [...] (float64)."""
    return (below < k).double().mean(-1)


def predicted_attention(
    pattern: torch.Tensor, input_ids: torch.Tensor, predicted: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention sums on earlier copies of the predicted token, and how many positions count.

    pattern [batch, head, q_pos, k_pos]; input_ids, predicted (the model's top-1 at each position)
    and mask [batch, pos]. A query position counts when its prediction occurs at some key position
    1..q (position 0 is the BOS sink). Returns (mass summed over counted positions [head], count).
    """
    pos = input_ids.shape[1]
    copies = predicted[:, :, None] == input_ids[:, None, :]  # [batch, q_pos, k_pos]
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()  # [q_pos, k_pos]
    causal[:, 0] = False
    copies = copies & causal & mask[:, None, :] & mask[:, :, None]  # [batch, q_pos, k_pos]
    counted = copies.any(-1)  # [batch, q_pos]
    mass = (pattern.double() * copies[:, None]).sum(-1)  # [batch, head, q_pos]
    return (mass * counted[:, None]).sum((0, 2)), int(counted.sum())  # [head], count


def text_attention(loaded, windows: list[list[int]]) -> torch.Tensor:
    """predicted_attention of every head, averaged over the counted positions: [n_layers, n_heads]."""
    return window_attention(loaded, windows)[0]


def window_attention(loaded, windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """predicted_attention of every head over all counted positions [n_layers, n_heads], its std
    across windows (each window's own mean; NaN below two windows with a counted position), and the
    number of counted positions. Full windows only (those as long as the first)."""
    model = loaded.model
    device = next(model.parameters()).device
    ids = torch.tensor([w for w in windows if len(w) == len(windows[0])])  # [batch, pos]
    mask = torch.ones_like(ids, dtype=torch.bool)  # [batch, pos]
    with torch.no_grad():
        out = model(input_ids=ids.to(device), output_attentions=True)
    top1 = out.logits.argmax(-1).cpu()  # [batch, pos]
    predicted = torch.full_like(top1, -1)  # [batch, pos]: -1 (never a token) where the prediction is wrong
    correct = top1[:, :-1] == ids[:, 1:]  # [batch, pos - 1]
    predicted[:, :-1] = torch.where(correct, top1[:, :-1], -1)
    per_window, counts = [], torch.zeros(len(ids))  # counted positions per window: [batch]
    for pattern in out.attentions:  # each [batch, head, q_pos, k_pos]
        masses = [
            predicted_attention(pattern[b : b + 1].cpu(), ids[b : b + 1], predicted[b : b + 1], mask[:1])
            for b in range(len(ids))
        ]
        per_window.append(torch.stack([mass for mass, _ in masses]))  # [batch, head]
        counts = torch.tensor([float(n) for _, n in masses])  # [batch]
    count = int(counts.sum())
    if count == 0:
        raise InputTextError("no position of the text predicts a token that occurs earlier in its window")
    sums = torch.stack(per_window)  # [layer, batch, head]
    mean = sums.sum(1) / count  # [layer, head]
    seen = counts > 0  # [batch]
    window_means = sums[:, seen] / counts[seen][None, :, None]  # [layer, seen, head]
    std = window_means.std(1) if int(seen.sum()) > 1 else torch.full_like(mean, float("nan"))  # [layer, head]
    return mean, std, count


def copy_suppression_scores(loaded, text: str, seed: int = 0, window: int = WINDOW) -> dict:
    """`cs_ov_score` and `predicted_attention` of every head ([n_layers, n_heads] float64 each),
    `copy_suppression` (bool, both cut-offs met), and `n_tokens` [n_layers, n_heads] of the vocabulary
    scored for the OV part."""
    window = min(window, loaded.spec.n_ctx)
    windows = text_windows(loaded.tokenizer, text, window, loaded.bos_token_id, max_windows=MAX_WINDOWS)
    vocab = cs_ov_vocab(loaded.model, seed=seed)
    ov = vocab["cs_ov_score"]  # [layer, head]
    attention = text_attention(loaded, windows)  # [layer, head]
    return {
        "cs_ov_score": ov,
        "predicted_attention": attention,
        "n_tokens": vocab["n"],
        "copy_suppression": (ov >= CS_OV_MIN) & (attention >= CS_ATTENTION_MIN),
    }
