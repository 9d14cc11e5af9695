"""Several processes, one run: what the loop needs from torch.distributed when a trainer backend
(trl) runs under `torchrun` / `accelerate launch`.

Rank 0 owns the run: the store, the run directory, held-out evaluation, failure analysis and
generation. Every rank trains (trl's `GRPOTrainer` under accelerate: DDP, DeepSpeed or FSDP) and
samples rollouts for its slice of each batch. The helpers here are the only collective calls the
loop makes itself; with one process (no launcher) each is the trivial local operation, so the
single-process path never initialises a process group.

The process group is accelerate's (`PartialState`: gloo on CPU, nccl on GPUs), created on first
use, so trl's trainer later finds and reuses it.
"""

from __future__ import annotations

import os
from typing import Any


def launched() -> bool:
    """True when a launcher started several processes for this run (`WORLD_SIZE` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _group() -> bool:
    """Initialise the process group where a launcher asked for one; True when there is one."""
    if not launched():
        return False
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState()  # reads the launcher's env (MASTER_ADDR, RANK, ...), picks the backend
    return dist.is_initialized()


def rank() -> int:
    return int(os.environ.get("RANK", "0")) if launched() else 0


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1")) if launched() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if _group():
        import torch.distributed as dist

        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled; for small state: task lists, RNG states)."""
    if not _group():
        return obj
    import torch.distributed as dist

    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(items: list[Any]) -> list[Any]:
    """Every rank's `items`, concatenated in rank order, on every rank."""
    if not _group():
        return list(items)
    import torch.distributed as dist

    boxes: list[Any] = [None] * world_size()
    dist.all_gather_object(boxes, list(items))
    return [x for box in boxes for x in box]
