"""Peak-memory helpers shared by the benchmarks: the kernel's RSS high-water mark (Linux).

tracemalloc cannot see torch's allocations, so the benchmarks read /proc/self/status instead.
"""


def status_kb(field: str) -> int:
    """A /proc/self/status field in kB (e.g. VmRSS, VmHWM)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Reset VmHWM to the current RSS (clear_refs 5) and return that RSS in kB."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return status_kb("VmRSS")
