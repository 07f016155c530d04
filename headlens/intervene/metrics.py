"""What an ablation measures: the metrics, and their value at each scored position.

Every metric is a mean over scored (sequence, position) pairs of one per-position value, read
from the final residual stream at that position (after the final norm) and a target token:
- `loss`: next-token cross-entropy of the text, in nats (`text` is accepted as an alias);
- `repeat`: the same loss on the second copy of repeated random tokens (Olsson et al. 2022);
- `logit-diff`: logit(target) - logit(foil) at a prompt's last position (IOI, Wang et al. 2022);
- `prob`: the target's probability at a prompt's last position;
- `needle`: 1 where the target (a needle token) is the model's top prediction, else 0: the share
  of needle tokens retrieved (Wu et al. 2024, adapted: headlens.intervene.evalset);
- `needle-loss`: the cross-entropy of those same needle tokens, in nats: continuous where the
  top-1 share is a step (it moves before a needle token stops being the top prediction, and
  keeps moving once none is).
Being means of per-position values, all metrics share one summing, bootstrapping and sweeping path.
Each metric has a unit (`UNIT`), carried by every result so that no chart or table mixes metrics.

The cross-entropy goes through the unembedding a vocabulary chunk at a time. At GPT-2's 50,257
tokens the unembedding is the largest matmul of a forward pass and its [positions, d_vocab] logits
the largest tensor (103 MB at 512 positions; autograd's log_softmax keeps two or three such
tensors for the backward pass). Here logsumexp runs over 4,096-row chunks of the unembedding and
the target logit is one dot product per position. Without grad the logits never exist whole; with
grad (attribution patching, head importance) one float32 copy (float32 or wider) is kept for the
backward pass, which needs softmax(logits) - onehot(target).
"""

from __future__ import annotations

import torch

from headlens.bounds import shown
from headlens.errors import ConfigError
from headlens.load.devices import onloaded

# Vocabulary rows per matmul: 4,096-row chunks ran faster than the whole matrix at once on CPU
# (BENCHMARKS.md, Ablation).
UNEMBED_CHUNK = 4096

METHODS = ("zero", "mean", "resample")
METRICS = ("loss", "repeat", "logit-diff", "prob", "needle", "needle-loss")
ALIASES = {"text": "loss"}
# The per-position value each metric averages.
KIND = {
    "loss": "loss",
    "repeat": "loss",
    "logit-diff": "logit_diff",
    "prob": "prob",
    "needle": "hit",
    "needle-loss": "loss",
}
# The unit of each metric's value (and of its change).
UNIT = {
    "loss": "nats/token",
    "repeat": "nats/token",
    "logit-diff": "logits",
    "prob": "probability",
    "needle": "share of needle tokens retrieved",
    "needle-loss": "nats/token",
}
PROMPT_METRICS = ("loss", "logit-diff", "prob")  # metrics a --prompts file can be scored with
NEEDLE_METRICS = ("needle", "needle-loss")  # metrics scored on the needle-in-a-haystack tests
# Metrics with a gradient (attribution patching needs one): the top-1 hit of `needle` has none.
DIFFERENTIABLE = ("loss", "repeat", "logit-diff", "prob", "needle-loss")


def canonical_metric(metric: str) -> str:
    """The metric's name with aliases resolved; ConfigError for an unknown one."""
    name = ALIASES.get(metric, metric)
    if name not in METRICS:
        raise ConfigError(f"unknown metric {shown(metric)}: choose one of {', '.join(METRICS)} (text = loss)")
    return name


def check_choice(method: str, metric: str) -> str:
    """ConfigError for an unknown method or metric; returns the canonical metric."""
    if method not in METHODS:
        raise ConfigError(f"unknown ablation method {shown(method)}: choose one of {', '.join(METHODS)}")
    return canonical_metric(metric)


def is_loss(metric: str) -> bool:
    return KIND[canonical_metric(metric)] == "loss"


def token_losses(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position: [batch, pos - 1], NaN where the target is padding.

    logits [batch, pos, d_vocab]; position t predicts token t + 1.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [batch, pos-1, d_vocab]
    loss = -logp.gather(-1, input_ids[:, 1:, None])[..., 0]  # [batch, pos-1]
    valid = mask[:, 1:] & mask[:, :-1]
    return loss.masked_fill(~valid, float("nan"))


def position_values(
    hidden: torch.Tensor, lm_head, targets: torch.Tensor, foils: torch.Tensor | None, kind: str
) -> torch.Tensor:
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
        part = torch.nn.functional.linear(
            flat, weight[start : start + chunk], None if bias is None else bias[start : start + chunk]
        ).float()  # [rows, chunk]
        best = torch.maximum(best, part.amax(-1))
        inside = (flat_targets >= start) & (flat_targets < start + part.shape[1])  # [rows]
        local = (flat_targets - start).clamp(0, part.shape[1] - 1)  # [rows]
        own = torch.where(inside, part.gather(1, local[:, None])[:, 0], own)
    return (own >= best).to(torch.float32).view(hidden.shape[:-1])


def unembed_losses(hidden: torch.Tensor, lm_head, targets: torch.Tensor, chunk: int = UNEMBED_CHUNK) -> torch.Tensor:
    """Cross-entropy -log softmax(lm_head(hidden))[target], float32 or wider: [..., n], hidden [..., n, d_model].

    Equal to the full log_softmax up to float32 rounding; differentiable in `hidden` (and in
    the unembedding's weight and bias when they require grad).
    """
    flat = hidden.reshape(-1, hidden.shape[-1])  # [rows, d_model]
    with onloaded(lm_head):  # an LM head accelerate offloaded is loaded for the call
        weight, bias = lm_head.weight, lm_head.bias  # [d_vocab, d_model], [d_vocab] or None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (flat, weight, bias)):
            flat_targets = torch.broadcast_to(targets, hidden.shape[:-1]).reshape(-1)  # [rows]
            return _ChunkedCrossEntropy.apply(flat, weight, bias, flat_targets, chunk).view(hidden.shape[:-1])
        lse = _scratch_logsumexp(flat, weight, bias, chunk).view(hidden.shape[:-1])  # [..., n]
        return lse - target_logits(hidden, weight, bias, targets)


def _chunk_logits(flat, weight, bias, start: int, chunk: int) -> torch.Tensor:
    part = torch.nn.functional.linear(
        flat, weight[start : start + chunk], None if bias is None else bias[start : start + chunk]
    )  # [rows, chunk]
    return part.to(torch.promote_types(part.dtype, torch.float32))  # half precision -> float32


def _chunked_logsumexp(flat, weight, bias, chunk: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """logsumexp over the vocabulary, [rows]; fills `keep` [rows, d_vocab] with the logits if given."""
    lses = []
    for start in range(0, weight.shape[0], chunk):
        part = _chunk_logits(flat, weight, bias, start, chunk)  # [rows, chunk]
        if keep is not None:
            keep[:, start : start + chunk] = part
        lses.append(torch.logsumexp(part, dim=-1))  # [rows]
    return torch.logsumexp(torch.stack(lses, dim=-1), dim=-1)  # [rows]


def _scratch_logsumexp(flat, weight, bias, chunk: int) -> torch.Tensor:
    """logsumexp over the vocabulary, [rows], without grad: the same products and reductions as
    `_chunked_logsumexp`, each chunk's logits written into one scratch tensor reused by every chunk
    (no [rows, chunk] tensor allocated per chunk, nor a second one for the shifted exponentials)."""
    rows, width = flat.shape[0], min(chunk, weight.shape[0])
    scratch = torch.empty(rows * width, dtype=flat.dtype, device=flat.device)  # [rows * chunk]
    lses = []
    for start in range(0, weight.shape[0], chunk):
        part_weight = weight[start : start + chunk]  # [chunk, d_model]
        part = scratch[: rows * part_weight.shape[0]].view(rows, -1)  # [rows, chunk]
        if bias is None:  # the products F.linear computes (mm, or addmm with a bias)
            torch.mm(flat, part_weight.t(), out=part)
        else:
            torch.addmm(bias[start : start + chunk], flat, part_weight.t(), out=part)
        lses.append(logsumexp_(part.to(torch.promote_types(part.dtype, torch.float32))))  # [rows]
    return torch.logsumexp(torch.stack(lses, dim=-1), dim=-1)  # [rows]


def logsumexp_(values: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(values, dim=-1) in the same steps (the row maximum, infinite maxima taken as 0,
    the shifted exponentials summed), overwriting `values` [rows, n] with its shifted exponentials: [rows]."""
    maxes = values.amax(-1, keepdim=True)  # [rows, 1]
    maxes.masked_fill_(maxes.abs() == float("inf"), 0.0)
    return values.sub_(maxes).exp_().sum(-1).log_().add_(maxes[:, 0])  # [rows]


def target_logits(hidden, weight, bias, targets) -> torch.Tensor:
    """The logit of each position's target token, float32 or wider: [..., n]; hidden [..., n, d_model]."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    target = (hidden.to(dtype) * weight[targets].to(dtype)).sum(-1)  # [..., n]
    return target if bias is None else target + bias[targets].to(dtype)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """losses[r] = logsumexp(x_r W^T + b) - (x_r . W[t_r] + b[t_r]); d/dx = (softmax - onehot) W."""

    @staticmethod
    def forward(ctx, flat, weight, bias, targets, chunk):
        dtype = torch.promote_types(flat.dtype, torch.float32)
        logits = torch.empty(flat.shape[0], weight.shape[0], dtype=dtype, device=flat.device)  # [rows, d_vocab]
        lse = _chunked_logsumexp(flat, weight, bias, chunk, keep=logits)  # [rows]
        ctx.save_for_backward(flat, weight, targets)
        ctx.logits, ctx.lse, ctx.has_bias = logits, lse, bias is not None
        return lse - logits.gather(1, targets[:, None])[:, 0]  # [rows]

    @staticmethod
    def backward(ctx, grad):
        flat, weight, targets = ctx.saved_tensors
        probs = ctx.logits.sub_(ctx.lse[:, None]).exp_()  # [rows, d_vocab] softmax, in place of the logits
        probs[torch.arange(len(targets), device=probs.device), targets] -= 1.0  # softmax - onehot
        probs.mul_(grad.to(probs.dtype)[:, None])  # [rows, d_vocab] dLoss/dlogits
        ctx.logits = None
        scores = probs.to(weight.dtype)
        grad_flat = scores @ weight if ctx.needs_input_grad[0] else None  # [rows, d_model]
        grad_weight = scores.T @ flat if ctx.needs_input_grad[1] else None  # [d_vocab, d_model]
        grad_bias = scores.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None  # [d_vocab]
        return grad_flat, grad_weight, grad_bias, None, None
