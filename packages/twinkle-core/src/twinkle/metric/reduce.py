"""Summing metric accumulators over the data-parallel ranks, so every rank reports the same numbers.

A no-op on one process. Under torch.distributed every rank must call ``compute`` (the model's
``calculate_metric``) together: it is a collective. Backends that use a sub-group for data
parallelism register it with :func:`set_reduce_group`.
"""

from __future__ import annotations

from typing import Any

_GROUP: Any = None


def set_reduce_group(group: Any) -> None:
    """Reduce over ``group`` (a torch process group) instead of the whole world; ``None`` resets."""
    global _GROUP
    _GROUP = group


def _active() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(_GROUP) > 1


def sum_across_ranks(values: list[Any]) -> list[float]:
    """Each value (number or tensor) summed over the ranks, as floats; local floats when alone."""
    if not _active():
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    packed = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=_GROUP)
    return packed.tolist()
