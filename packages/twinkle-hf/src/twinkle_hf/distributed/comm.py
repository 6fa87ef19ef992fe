"""Small collectives the model needs: global token counts, full tensors from shards, agreement."""

from __future__ import annotations

from typing import Any

import torch


def is_distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if is_distributed() else 0


def global_sums(*values: Any) -> list[float]:
    """Numbers (or 1-element tensors) summed over every rank, as floats (one all_reduce)."""
    if not is_distributed():
        return [float(v) for v in values]
    import torch.distributed as dist

    packed = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(packed)
    return packed.tolist()


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor (a collective: every rank calls it), plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    return value


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def agree(ok: bool, what: str) -> None:
    """Every rank learns whether all succeeded; the ones that did raise too, naming the failed ranks."""
    if not is_distributed():
        return
    import torch.distributed as dist

    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    failed = [r for r, f in enumerate(flags) if not f]
    if failed and ok:
        raise RuntimeError(f"{what} failed on rank(s) {failed}; this rank stopped too (see their error).")


def broadcast_object(value: Any) -> Any:
    """``value`` of rank 0, on every rank."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
