"""Many processes, one answer: work split across the ranks of a torch.distributed job.

Launched under `torchrun --nproc-per-node N` (or `accelerate launch`), the environment names a
WORLD_SIZE > 1 and `init()` joins the process group (gloo on CPU, nccl on CUDA). In one process
every function here is the identity, so library code calls them unconditionally:
- `shard(items)`: this rank's share of an ordered stream (item i goes to rank i % world);
- `all_reduce_totals(reducers)`: sums each reducer's running totals (the attributes it names in
  `totals`) over the ranks, so every rank ends with the single-process statistics;
- `all_gather(obj)`: every rank's object, in rank order;
- `is_main()`: rank 0, the one process that prints and writes outputs.
Work is sharded by whole batches and heads, never inside one: each rank computes its share
exactly as one process would, so merged results differ from a single process only by the order
of float64 additions (scores) or not at all (sweep rows).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from headlens.errors import HeadlensError


def init() -> None:
    """Join the torch.distributed job named by the environment (torchrun sets WORLD_SIZE, RANK,
    MASTER_ADDR, MASTER_PORT); nothing in a single process or when already joined."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "nccl" if torch.cuda.is_available() and os.environ.get("HEADLENS_BACKEND") != "gloo" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def local_device(device: str | torch.device | None) -> str | torch.device | None:
    """On a multi-GPU job each rank takes its own GPU (LOCAL_RANK) unless told otherwise."""
    if device in (None, "cuda") and world_size() > 1 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def shard(items: Iterable) -> Iterator:
    """This rank's items of an ordered stream: item i goes to rank i % world_size."""
    r, n = rank(), world_size()
    for index, item in enumerate(items):
        if index % n == r:
            yield item


def _collective_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A copy on the device the backend reduces on (CUDA for nccl, CPU for gloo)."""
    if dist.get_backend() == "nccl":
        return tensor.to(torch.device("cuda", torch.cuda.current_device()))
    return tensor.cpu().clone()


def all_reduce_totals(reducers: Iterable) -> None:
    """Sum every reducer's `totals` attributes (tensors of running sums and counts) over ranks, in place."""
    if world_size() == 1:
        return
    for reducer in reducers:
        for name in reducer.totals:
            value = getattr(reducer, name)
            summed = _collective_tensor(value)
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
            value.copy_(summed.to(value.device))


def all_gather(obj) -> list:
    """Every rank's `obj` (picklable), in rank order; [obj] in one process."""
    if world_size() == 1:
        return [obj]
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def sum_in_order(parts: dict[int, tuple[int, torch.Tensor]], zeros: torch.Tensor) -> torch.Tensor:
    """Collective: `zeros` plus every rank's parts, added in index order on every rank.

    A part {index: (start, values)} adds `values` to rows start..start + len(values) of the total.
    Work sharded by batch (`shard`) returns each batch's contribution under its batch index; adding
    them in batch order reproduces a single process's running sum bit for bit (a plain all-reduce
    adds per-rank subtotals, which rounds differently)."""
    merged: dict[int, tuple[int, torch.Tensor]] = {}
    for gathered in all_gather({index: (start, values.cpu()) for index, (start, values) in parts.items()}):
        merged.update(gathered)
    total = zeros.clone()
    for index in sorted(merged):
        start, values = merged[index]
        total[start : start + len(values)] += values.to(total.device)
    return total


def broadcast_error(error: Exception | None) -> None:
    """Collective: if any rank hit a HeadlensError, every rank raises it (the first, in rank
    order), so no rank waits forever on a collective the failed one will never join."""
    errors = all_gather(None if error is None else (type(error), str(error)))
    if error is not None and world_size() == 1:
        raise error
    for found in errors:
        if found is not None:
            kind, message = found
            raise (kind if issubclass(kind, HeadlensError) else HeadlensError)(message)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
