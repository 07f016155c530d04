"""Where a model runs and in what precision: device and dtype names, and accelerate's big-model
placement (`device_map`), resolved once at load time (headlens.load.models.load_model); and
`tensor_checksum`, a tensor's checksum read where the tensor is (LoadedModel.digest hashes the weights with it)."""

from __future__ import annotations

import contextlib
import hashlib

import torch

from headlens.errors import DeviceError

# --dtype names -> torch dtypes. Scores and losses are accumulated in float32 or wider whatever
# the model's dtype (capture rebuilds patterns in float32; reducers sum in float64).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """A dtype name of DTYPES (or a torch dtype among them) -> torch dtype; None -> float32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise DeviceError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` or `mps` -> a torch device this machine has; None -> the GPU when
    one is present (CUDA, then Apple MPS), else the CPU. DeviceError for anything else."""
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {device!r}: give cpu, cuda, cuda:N or mps") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceError(f"device {device!r} asked for, but CUDA is not available on this machine")
        if resolved.index is not None and resolved.index >= count:
            raise DeviceError(
                f"device {device!r} is out of range: this machine has {count} CUDA device(s) (cuda:0-cuda:{count - 1})"
            )
    elif resolved.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device {device!r} asked for, but Apple MPS is not available on this machine")
    elif resolved.type != "cpu":
        raise DeviceError(f"unknown device {device!r}: give cpu, cuda, cuda:N or mps")
    return resolved


def placement_kwargs(device_map, max_memory, offload_folder) -> dict:
    """from_pretrained keyword arguments for accelerate's big-model placement (empty without a map)."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise DeviceError("max_memory and offload_folder need a device_map (e.g. device_map='auto')")
        return {}
    if isinstance(device_map, str) and device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise DeviceError(f"unknown device_map {device_map!r}: give auto, balanced, balanced_low_0 or sequential")
    placement = {"device_map": device_map}
    if max_memory is not None:
        placement["max_memory"] = max_memory
    if offload_folder is not None:
        placement["offload_folder"] = str(offload_folder)
    return placement


def is_offloaded(module: torch.nn.Module) -> bool:
    """True when accelerate keeps `module`'s own weights off-device (CPU or disk offload of a
    `device_map` model): they are on the meta device except while the module runs."""
    hook = getattr(module, "_hf_hook", None)
    return hook is not None and bool(getattr(hook, "offload", False))


@contextlib.contextmanager
def onloaded(module: torch.nn.Module):
    """Within the block, `module`'s own weights are real tensors on its execution device, also
    when accelerate offloaded them (accelerate.utils.align_module_device); copy what must outlive
    the block. A module that is not offloaded is left as it is."""
    if not is_offloaded(module):
        yield
        return
    from accelerate.utils import align_module_device

    with align_module_device(module):
        yield


# --batch-size auto starts here and halves on each out-of-memory error.
AUTO_BATCH_START = 64


def with_largest_batch(run, start: int = AUTO_BATCH_START):
    """`run(batch_size)` with the largest batch size that fits: start at `start`, halve on an
    out-of-memory error and run again from scratch (accelerate's find_executable_batch_size, told
    to halve rather than take its default 0.9 steps).
    Returns (result, the batch size that ran). `run` must be repeatable (no half-consumed input)."""
    from accelerate.utils import find_executable_batch_size

    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=start, reduce_batch_size_fn=lambda: tried[-1] // 2)
    def attempt(batch_size: int):
        tried.append(batch_size)
        return run(batch_size)

    return attempt(), tried[-1]


def tensor_checksum(tensor: torch.Tensor) -> bytes:
    """On CPU the sha256 of the tensor's bytes (every bit counts, and no conversion of every element
    as float64 sums would need); elsewhere, not to copy the weights to the host, the float64 sum and sum of
    squares computed on the device (no content for integer tensors)."""
    if tensor.device.type == "cpu":
        return hashlib.sha256(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data).digest()
    if not tensor.is_floating_point():
        return b""
    total = float(torch.sum(tensor, dtype=torch.float64))
    square = float(torch.linalg.vector_norm(tensor, dtype=torch.float64))
    return f"{total!r}|{square!r}".encode()
