"""Linear layers through oneDNN inside `no_pattern_kernels`: x W^T + b to float32 rounding, hooks kept,
torch's own path under autograd, everything restored afterwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headlens.arch.kernels import no_pattern_kernels, onednn_available, onednn_linear, onednn_linears

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_is_the_affine_map_to_float32_rounding(bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=gen)  # [batch, pos, d_in]
    weight = torch.randn(40, 64, generator=gen) / 8  # [d_out, d_in]
    b = torch.randn(40, generator=gen) if bias else None  # [d_out]
    want = x.double() @ weight.double().T + (0 if b is None else b.double())  # [batch, pos, d_out] float64
    with torch.no_grad():
        got = onednn_linear(x, weight, b)
    assert got.shape == (3, 7, 40) and got.dtype == torch.float32
    # 64 products of unit scale summed in float32: a few ulps of values up to ~4
    torch.testing.assert_close(got.double(), want, atol=5e-6, rtol=0)


def test_linear_layers_run_through_onednn_only_inside_the_block_and_keep_their_hooks():
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    x = torch.randn(5, 16, generator=gen)  # [rows, d_in]
    seen = []
    model[2].register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    with torch.no_grad():
        want = model(x)  # [rows, 8]
        with no_pattern_kernels(model):
            swapped = "forward" in vars(model[0]) and "forward" in vars(model[2])
            got = model(x)
    assert swapped == onednn_available()
    assert seen == [(5, 32), (5, 32)]  # the hook fired both times
    assert not any("forward" in vars(m) for m in model)  # restored
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_autograd_and_replaced_forwards_keep_torchs_own_path():
    gen = torch.Generator().manual_seed(2)
    layer, offloaded = nn.Linear(16, 8), nn.Linear(16, 8)
    offloaded.forward = lambda x: torch.zeros(x.shape[0], 8)  # a forward replaced as accelerate's hooks do
    x = torch.randn(4, 16, generator=gen, requires_grad=True)  # [rows, d_in]
    want = nn.functional.linear(x, layer.weight, layer.bias)
    with onednn_linears(nn.ModuleList([layer, offloaded])):
        got = layer(x)  # grad enabled: F.linear itself
        assert torch.equal(offloaded(x), torch.zeros(4, 8))
    assert torch.equal(got, want) and got.requires_grad
    got.sum().backward()
    assert x.grad is not None
