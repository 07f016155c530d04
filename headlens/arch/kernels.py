"""The kernels of forward passes that read no attention pattern: fused attention, oneDNN matrix products.

`no_pattern_kernels(model)` is the context every ablation run (set ablations, sweeps, z captures, the
token view) evaluates the model in, so that all of them round alike:
- attention through torch's fused scaled_dot_product_attention (headlens.arch.context.NO_PATTERN);
- every float32 `nn.Linear` on CPU through oneDNN (`torch.ops.mkldnn._linear_pointwise`, the operator
  torch.compile's CPU backend calls) instead of torch's default MKL sgemm, which was slower on the
  model's block products (benchmarks/bench_gemm_backends.py; the figures are in BENCHMARKS.md): the same
  sums in another order (float32 rounding).
A linear layer keeps torch's own path when autograd records (the oneDNN operator has no backward),
for other dtypes and devices, when accelerate replaced its forward (offloading), and everywhere when
torch was built without oneDNN. Forward hooks fire as before: only `forward` is swapped, for the block.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from headlens.arch.context import NO_PATTERN, attention_implementation


def onednn_available() -> bool:
    """True when this torch can run float32 linear layers through oneDNN."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias like F.linear, through oneDNN where it applies (see the module's docstring):
    x [..., d_in], weight [d_out, d_in] -> [..., d_out]."""
    usable = not torch.is_grad_enabled() and x.device.type == "cpu" and weight.device.type == "cpu"
    if not usable or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return nn.functional.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])  # [rows, d_in]
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")  # [rows, d_out]
    return out.view(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def onednn_linears(model: nn.Module):
    """Within the block every plain `nn.Linear` of `model` runs `onednn_linear`."""
    linears = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in vars(m)]
    if not onednn_available():
        linears = []
    try:
        for module in linears:
            vars(module)["forward"] = _forward_of(module)  # an instance attribute, found before the class method
        yield
    finally:
        for module in linears:
            vars(module).pop("forward", None)


def _forward_of(module: nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, module.weight, module.bias)

    return forward


@contextlib.contextmanager
def no_pattern_kernels(model: nn.Module):
    """Fused attention and oneDNN linear layers for the block (the module's docstring)."""
    with attention_implementation(model, NO_PATTERN), onednn_linears(model):
        yield
