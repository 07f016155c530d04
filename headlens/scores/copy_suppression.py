"""Copy-suppression (negative) heads: attend to the token the model predicts, and lower its logit.

McDougall et al. 2023, "Copy Suppression: Comprehensively Understanding an Attention Head"
(arXiv 2310.04625; GPT-2 small 10.7, also 11.10). Their weights-based evidence has two halves, both
scored here over the vocabulary with the paper's effective embedding W_EE (layer 0's attention
locked on the token, then MLP0) and the same seeded tokens:
- OV (headlens.scores.ov_vocab): `cs_ov_score` = share of the vocabulary's tokens whose own logit
  ranks in the bottom BOTTOM_K = 10 of their column of W_U W_OV W_EE (attending to t writes t down);
- QK (headlens.scores.qk_vocab): `cs_qk_score` = share of tokens whose own key ranks in the top
  TOP_K = 10 of their row of W_U^T W_Q W_K^T W_EE^T, the query built from t's unembedding (the
  residual stream predicting t), the keys from every token's W_EE (predicting t, the head attends
  back to copies of t). Rotary families are scored without rotation, the score at relative offset 0
  (qk_vocab's docstring); at offsets 1, 8 and 64 SmolLM2's 24.4 and 23.3 move by <= 0.01, Gemma 3
  270M's 3.3, 6.0 and 7.1 by up to +0.075 (offset 64), none near the cut-off (BENCHMARKS.md).
A random head puts a token there with chance 10 / d_vocab for either half. Each is exact up to
2,401 tokens, else a seeded sample of the vocabulary with a 95% interval of at most +-0.02.
A head is a copy-suppression head when cs_ov_score >= CS_OV_MIN and cs_qk_score >= CS_QK_MIN. The
paper reports how far 10.7 meets each criterion but fixes no cut-off; ours is 0.5 for both: most of
the vocabulary, as for 10.7, where a random head scores ~0.0002 (10 / 50,257). classify scores the
QK half only in the layers where some head meets the OV cut-off (headlens.classify.kind_runs.qk_gate_layers;
the labels are the same, cs_qk_score is NaN elsewhere); `copy_suppression_scores` scores every layer.

SmolLM2-135M (BENCHMARKS.md): the OV criterion singles out 24.4 (0.578) and 23.3 (0.561), every other
head <= 0.09; the QK criterion does not follow: 24.4 scores 0.125 (median rank of its own key 481 of
49,152) and 23.3 0.005 (median rank 12,439), so neither is a copy-suppression head by both published
criteria, and the report does not name them so.

`predicted_attention`, shown beside the two as evidence and never a cut-off, is a behavioural mean on
natural text: at query positions where the model's own top-1 prediction is the true next token and
already occurs earlier in the window (position 0, the BOS sink, is not a copy), the head's attention
mass on those earlier copies. It is not McDougall et al.'s quantity: their QK evidence is the weights'
circuit above, and their behavioural examples are positions where earlier layers predict a token
strongly (IOI: SmolLM2's 24.4 puts 0.61 of its attention on the indirect object where the model
predicts it). On natural text (16 windows of 64 tokens of the default text, 177 counted positions)
SmolLM2's 24.4 and 23.3 rest on the BOS sink (0.60 and 0.73 of their attention) and put 0.043 and
0.027 on the predicted token's copies; taking the prediction from the logit lens at the head's input
instead (any, wrong ones only, or confidence >= 0.9) gives 0.015-0.022.

The classify probe (`probe_copy_suppression`, headlens.classify.kind_runs): the attention part reads
windows of the text probe's first tokens (its haystack, already tokenized), at most 2 x token_budget
tokens; the OV and QK parts' cost is fixed by the vocabulary (BENCHMARKS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from headlens.errors import InputTextError
from headlens.probes.inputs import text_windows
from headlens.scores.ov_vocab import BOTTOM_K, cs_ov_vocab
from headlens.scores.qk_vocab import cs_qk_vocab

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

CS_OV_MIN = 0.5  # share of tokens (ours; see the module docstring)
CS_QK_MIN = 0.5  # share of tokens (ours; see the module docstring)
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


def text_attention(loaded: LoadedModel, windows: list[list[int]]) -> torch.Tensor:
    """predicted_attention of every head, averaged over the counted positions: [n_layers, n_heads]."""
    return window_attention(loaded, windows)[0]


def window_attention(loaded: LoadedModel, windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
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


def copy_suppression_scores(loaded: LoadedModel, text: str, seed: int = 0, window: int = WINDOW) -> dict:
    """`cs_ov_score`, `cs_qk_score` and `predicted_attention` of every head ([n_layers, n_heads]
    float64 each), `copy_suppression` (bool, both weight criteria met), and `n_tokens` [n_layers,
    n_heads] of the vocabulary scored for the OV part (the QK part's in `n_qk_tokens`)."""
    window = min(window, loaded.spec.n_ctx)
    windows = text_windows(loaded.tokenizer, text, window, loaded.bos_token_id, max_windows=MAX_WINDOWS)
    ov_run, qk_run = cs_ov_vocab(loaded.model, seed=seed), cs_qk_vocab(loaded.model, seed=seed)
    ov, qk = ov_run["cs_ov_score"], qk_run["cs_qk_score"]  # [layer, head] each
    return {
        "cs_ov_score": ov,
        "cs_qk_score": qk,
        "predicted_attention": text_attention(loaded, windows),  # [layer, head]
        "n_tokens": ov_run["n"],
        "n_qk_tokens": qk_run["n"],
        "copy_suppression": (ov >= CS_OV_MIN) & (qk >= CS_QK_MIN),
    }
