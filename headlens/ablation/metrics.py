"""What an ablation measures: the metrics, and their value at each scored position.

Every metric is a mean over scored (sequence, position) pairs of one per-position value, read
from the final residual stream at that position (after the final norm) and a target token:
- `loss`: next-token cross-entropy of the text, in nats (`text` is accepted as an alias);
- `repeat`: the same loss on the second copy of repeated random tokens (Olsson et al. 2022);
- `logit-diff`: logit(target) - logit(foil) at a prompt's last position (IOI, Wang et al. 2022);
- `prob`: the target's probability at a prompt's last position;
- `needle`: 1 where the target (a needle token) is the model's top prediction, else 0: the share
  of needle tokens retrieved (Wu et al. 2024, adapted: headlens.ablation.prompts).
Being means of per-position values, all metrics share one summing, bootstrapping and sweeping path.
"""

from __future__ import annotations

import torch

from headlens.ablation.unembed import UNEMBED_CHUNK, target_logits, unembed_losses
from headlens.errors import ConfigError

METHODS = ("zero", "mean", "resample")
METRICS = ("loss", "repeat", "logit-diff", "prob", "needle")
ALIASES = {"text": "loss"}
# The per-position value each metric averages.
KIND = {"loss": "loss", "repeat": "loss", "logit-diff": "logit_diff", "prob": "prob", "needle": "hit"}
PROMPT_METRICS = ("loss", "logit-diff", "prob")  # metrics a --prompts file can be scored with
# Metrics with a gradient (attribution patching needs one): the top-1 hit of `needle` has none.
DIFFERENTIABLE = ("loss", "repeat", "logit-diff", "prob")


def canonical_metric(metric: str) -> str:
    """The metric's name with aliases resolved; ConfigError for an unknown one."""
    name = ALIASES.get(metric, metric)
    if name not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)} (text = loss)")
    return name


def check_choice(method: str, metric: str) -> str:
    """ConfigError for an unknown method or metric; returns the canonical metric."""
    if method not in METHODS:
        raise ConfigError(f"unknown ablation method {method!r}: choose one of {', '.join(METHODS)}")
    return canonical_metric(metric)


def is_loss(metric: str) -> bool:
    return KIND[canonical_metric(metric)] == "loss"


def position_values(hidden: torch.Tensor, lm_head, targets: torch.Tensor, foils: torch.Tensor | None,
                    kind: str) -> torch.Tensor:
    """Per-position metric values, float32 or wider: [..., n]; hidden [..., n, d_model] after the
    final norm, targets and foils [n] token ids. Differentiable in `hidden` except for `hit`."""
    if kind == "loss":
        return unembed_losses(hidden, lm_head, targets)
    if kind == "prob":
        return torch.exp(-unembed_losses(hidden, lm_head, targets))
    weight, bias = lm_head.weight, lm_head.bias  # [d_vocab, d_model], [d_vocab] or None
    if kind == "logit_diff":
        return target_logits(hidden, weight, bias, targets) - target_logits(hidden, weight, bias, foils)
    if kind == "hit":
        return _top1_hits(hidden, weight, bias, targets)
    raise ValueError(f"unknown metric kind {kind!r}")


def _top1_hits(hidden, weight, bias, targets, chunk: int = UNEMBED_CHUNK) -> torch.Tensor:
    """1.0 where the target's logit is the largest of the vocabulary, else 0.0: [..., n]. The
    target's logit is read from the same chunked matmul as the maximum (no rounding mismatch)."""
    flat = hidden.detach().reshape(-1, hidden.shape[-1])  # [rows, d_model]
    flat_targets = torch.broadcast_to(targets, hidden.shape[:-1]).reshape(-1)  # [rows]
    best = torch.full((flat.shape[0],), float("-inf"), device=flat.device)  # [rows]
    own = torch.full_like(best, float("-inf"))  # [rows]
    for start in range(0, weight.shape[0], chunk):
        part = torch.nn.functional.linear(flat, weight[start:start + chunk],
                                          None if bias is None else bias[start:start + chunk]).float()  # [rows, chunk]
        best = torch.maximum(best, part.amax(-1))
        inside = (flat_targets >= start) & (flat_targets < start + part.shape[1])  # [rows]
        local = (flat_targets - start).clamp(0, part.shape[1] - 1)  # [rows]
        own = torch.where(inside, part.gather(1, local[:, None])[:, 0], own)
    return (own >= best).to(torch.float32).view(hidden.shape[:-1])
