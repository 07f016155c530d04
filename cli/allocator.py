"""The command line's memory allocator settings: freed tensor memory is kept for the next tensor.

A forward pass allocates and frees tensors of tens of MB per layer ([4, 1,024, 1,536] float32 is
25 MB). By default glibc's malloc serves such a block with mmap and unmaps it when it is freed
(raising its threshold to that block's size, 32 MiB at most), and trims the top of the heap once twice
that threshold is free there, so later tensors keep landing on fresh pages that the kernel faults in
and zero-fills: page faults and system time that BENCHMARKS.md (Ablation) measures on SmolLM2's
`ablate --heads 3.4,5.1`.
`keep_freed_memory` raises both limits through mallopt(3), the settings the MALLOC_MMAP_THRESHOLD_
and MALLOC_TRIM_THRESHOLD_ environment variables would make: blocks up to glibc's largest
threshold (32 MiB on 64-bit) come from the heap and freed memory stays there for reuse. The
process's peak memory is what it allocates at once, as before; it is not returned while the
command runs. Only the `headlens` command calls it: a library import leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the largest it accepts
TRIM_THRESHOLD = 1024 * 1024 * 1024  # free heap kept before it is trimmed: more than a forward pass frees


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (see the module's docstring); True when both were set.
    Elsewhere than Linux with glibc nothing changes and False is returned."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library by that name, or one without mallopt (musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
