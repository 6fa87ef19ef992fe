"""The few torch.distributed calls the Trainer needs, no-ops in a single process."""

from __future__ import annotations

from typing import Any


def active() -> bool:
    """True under torchrun with more than one process (torch.distributed initialised)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if active() else 0


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
