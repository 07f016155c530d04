"""The unembedding's no-grad logsumexp in one reused scratch tensor, and the command line's allocator
settings: the same numbers as before, fewer fresh pages."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from headlens.intervene.metrics import _chunked_logsumexp, _scratch_logsumexp, logsumexp_, unembed_losses

INF = float("inf")


def test_in_place_logsumexp_is_torch_logsumexp_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(64, 300, generator=gen) * 20  # [rows, n], wide enough that the shift matters
    values[3] = -INF  # every entry -inf: the maximum is taken as 0, the result -inf
    values[4, 7] = INF  # an infinite entry: the result +inf
    values[5, :100] = -INF  # some entries -inf
    want = torch.logsumexp(values, dim=-1)  # [rows]
    got = logsumexp_(values.clone())
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got.isnan(), want.isnan())
    finite = want.isfinite()
    assert torch.equal(got[finite], want[finite])
    assert got[3] == -INF and got[4] == INF


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_scratch_logsumexp_equals_a_new_tensor_per_chunk(dtype, bias):
    """The scratch path against the per-chunk path of F.linear + torch.logsumexp (the grad path,
    itself checked against log_softmax in test_sweep.py): the same products, bit for bit, with a last
    chunk shorter than the others (50 = 3 x 16 + 2) and half-precision logits promoted to float32."""
    gen = torch.Generator().manual_seed(1)
    flat = (torch.randn(37, 24, generator=gen) * 3).to(dtype)  # [rows, d_model]
    weight = torch.randn(50, 24, generator=gen).to(dtype)  # [d_vocab, d_model]
    b = torch.randn(50, generator=gen).to(dtype) if bias else None  # [d_vocab]
    want = _chunked_logsumexp(flat, weight, b, 16)  # [rows]
    got = _scratch_logsumexp(flat, weight, b, 16)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)


def test_unembed_losses_without_grad_match_log_softmax_in_float64():
    """An independent computation: the whole log_softmax in float64 from the same float32 inputs."""
    gen = torch.Generator().manual_seed(2)
    head = torch.nn.Linear(32, 1000, bias=False)
    hidden = torch.randn(2, 40, 32, generator=gen) * 4  # [copies, n, d_model]
    targets = torch.randint(0, 1000, (40,), generator=gen)  # [n]
    with torch.no_grad():
        logits = hidden.double() @ head.weight.double().T  # [copies, n, d_vocab]
        want = -torch.log_softmax(logits, -1)[:, torch.arange(40), targets]  # [copies, n]
        got = unembed_losses(hidden, head, targets, chunk=300)
    # float32 logits of ~|12|: a few ulps each, logsumexp and the target's dot product add a few more
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)


# Mallocs, writes and frees a 20 MB block twice through the C library and prints the page faults of the
# second round. glibc's default serves the first block with mmap and unmaps it on free, so the second
# (from the heap, its threshold raised by that free) is faulted in again; with freed memory kept the
# first block comes from the heap and stays there, and the second reuses its pages.
_FAULTS = """
import ctypes, resource, sys
if sys.argv[1] == "keep":
    from headlens.cli.allocator import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
size = 20 * 1024 * 1024
for round in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_keep_freed_memory_reuses_pages_instead_of_faulting_them_in():
    pages = 20 * 1024 * 1024 // 4096  # 5,120 pages of 4 KB

    def faults(mode: str) -> int:
        run = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    assert faults("default") >= pages // 2  # glibc hands the block back on free: faulted in again
    assert faults("keep") < pages // 10  # kept in the heap: reused
