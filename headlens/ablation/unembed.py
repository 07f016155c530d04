"""Next-token cross-entropy through the unembedding, a vocabulary chunk at a time.

At GPT-2's 50,257 tokens the unembedding is the largest matmul of a forward pass and its
[positions, d_vocab] logits the largest tensor (103 MB at 512 positions; autograd's log_softmax
keeps two or three such tensors for the backward pass). Here logsumexp runs over 4,096-row
chunks of the unembedding and the target logit is one dot product per position. Without grad
the logits never exist whole; with grad (attribution patching, head importance) one float32
copy (float32 or wider) is kept for the backward pass, which needs softmax(logits) - onehot(target).
"""

from __future__ import annotations

import torch

from headlens.devices import onloaded

# Vocabulary rows per matmul: 4,096-row chunks ran faster than the whole matrix at once on CPU
# (BENCHMARKS.md, Ablation).
UNEMBED_CHUNK = 4096


def unembed_losses(hidden: torch.Tensor, lm_head, targets: torch.Tensor,
                   chunk: int = UNEMBED_CHUNK) -> torch.Tensor:
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
        lse = _chunked_logsumexp(flat, weight, bias, chunk).view(hidden.shape[:-1])  # [..., n]
        return lse - target_logits(hidden, weight, bias, targets)


def _chunk_logits(flat, weight, bias, start: int, chunk: int) -> torch.Tensor:
    part = torch.nn.functional.linear(flat, weight[start:start + chunk],
                                      None if bias is None else bias[start:start + chunk])  # [rows, chunk]
    return part.to(torch.promote_types(part.dtype, torch.float32))  # half precision -> float32


def _chunked_logsumexp(flat, weight, bias, chunk: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """logsumexp over the vocabulary, [rows]; fills `keep` [rows, d_vocab] with the logits if given."""
    lses = []
    for start in range(0, weight.shape[0], chunk):
        part = _chunk_logits(flat, weight, bias, start, chunk)  # [rows, chunk]
        if keep is not None:
            keep[:, start:start + chunk] = part
        lses.append(torch.logsumexp(part, dim=-1))  # [rows]
    return torch.logsumexp(torch.stack(lses, dim=-1), dim=-1)  # [rows]


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
