"""Every collective twinkle makes: all-reduce, all-gather, broadcast, barrier and rank agreement.

Why one module: gloo (CPU) accepts tensors that NCCL (CUDA) and HCCL (Ascend) reject, so a
collective written against the CPU test setup crashes on the first multi-GPU step. Here every
tensor handed to ``torch.distributed`` lives on :func:`comm_device` (the platform's device:
``cuda:N`` under NCCL, ``npu:N`` under HCCL, ``cpu`` under gloo) and results come back on the
caller's device. A tensor collective does three things on the communication device -- move in,
communicate, move out -- and nothing waits for the device: callers that want Python numbers
convert once (:func:`sum_floats`). Process groups carry a CPU backend beside the accelerator one
(``"cpu:gloo,cuda:nccl"``, see ``twinkle.platform``), so object collectives keep working.

Every function is a no-op returning the local value when torch.distributed is not initialised or
the group has a single rank, so callers never branch on "am I distributed". Package code outside
this module never calls a ``torch.distributed`` collective itself (``tests/core/test_collective.py``
enforces it). ``src``/``dst`` are global ranks, as in ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from twinkle.utils.checks import check_choice

_DATA_GROUP: Any = None
_OPS = ("sum", "max", "min")


# ------------------------------------------------------------------- topology
def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def active(group: Any = None) -> bool:
    """True when torch.distributed is up and ``group`` (default: the world) has more than one rank."""
    dist = _dist()
    return dist is not None and dist.get_world_size(group) > 1


def rank(group: Any = None) -> int:
    """This process's rank in ``group`` (0 on a single process)."""
    dist = _dist()
    return dist.get_rank(group) if dist is not None else 0


def world_size(group: Any = None) -> int:
    """Ranks in ``group`` (1 on a single process)."""
    dist = _dist()
    return dist.get_world_size(group) if dist is not None else 1


def set_data_group(group: Any) -> None:
    """The group that metrics and token counts are summed over (``None``: the whole world).

    A backend whose data-parallel ranks are a sub-group (Megatron with TP/PP) registers it.
    """
    global _DATA_GROUP
    _DATA_GROUP = group


def data_group() -> Any:
    """The registered data-parallel group (``None``: the world)."""
    return _DATA_GROUP


@lru_cache(maxsize=8)
def _platform(name: str | None) -> Any:
    from twinkle.platform import detect_platform

    return detect_platform(name)


def comm_device() -> torch.device:
    """Where tensors handed to a collective must live: the platform's current device."""
    from twinkle.runtime import get_runtime

    runtime = get_runtime()
    return _platform(runtime.platform if runtime.initialized else None).comm_device()


def _move_in(tensor: torch.Tensor, owned: bool = False) -> torch.Tensor:
    """A contiguous buffer on the communication device; a private copy unless ``owned`` already is one."""
    device = comm_device()
    tensor = tensor.detach()
    if tensor.device != device:
        return tensor.to(device, memory_format=torch.contiguous_format)
    if owned and tensor.is_contiguous():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _reduce_op(op: str) -> Any:
    check_choice(op, "op", _OPS)
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]


# -------------------------------------------------------------------- tensors
def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """``tensor`` reduced over ``group``, as a new tensor on ``tensor``'s device (no host sync)."""
    return _all_reduce(tensor, op, group, owned=False)


def _all_reduce(tensor: torch.Tensor, op: str, group: Any, owned: bool) -> torch.Tensor:
    reduce_op = _reduce_op(op)
    if not active(group):
        return tensor
    import torch.distributed as dist

    buffer = _move_in(tensor, owned)
    dist.all_reduce(buffer, op=reduce_op, group=group)
    return buffer.to(tensor.device)


def sum_values(values: Sequence[Any], group: Any = None) -> torch.Tensor:
    """Numbers and one-element tensors summed over ``group`` in one all-reduce, as a float64 vector.

    The vector is built on the device of the first tensor among ``values`` (the CPU when there is
    none) and comes back there; nothing waits for the device. Callers that need Python numbers
    call ``.tolist()`` once (see :func:`sum_floats`).
    """
    if not values:
        raise ValueError("sum_values needs at least one value.")
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    packed = torch.stack([_as_float64(v, device) for v in values])
    return _all_reduce(packed, "sum", group, owned=True)


def _as_float64(value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"sum_values takes numbers and one-element tensors, got a tensor of shape "
                             f"{tuple(value.shape)}.")
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def sum_floats(values: Sequence[Any], group: Any = None) -> list[float]:
    """:func:`sum_values` as Python floats (one host sync)."""
    return sum_values(values, group).tolist()


def broadcast_(tensor: torch.Tensor, src: int = 0, group: Any = None) -> torch.Tensor:
    """Overwrite ``tensor`` with global rank ``src``'s value (in place; returns it)."""
    if not active(group):
        return tensor
    import torch.distributed as dist

    device = comm_device()
    in_place = tensor.device == device and tensor.is_contiguous()
    buffer = tensor.detach() if in_place else _move_in(tensor)
    dist.broadcast(buffer, src=src, group=group)
    if not in_place:
        with torch.no_grad():
            tensor.copy_(buffer)
    return tensor


def all_gather(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in rank order, on ``tensor``'s device."""
    if not active(group):
        return [tensor]
    import torch.distributed as dist

    local = _move_in(tensor, owned=True)
    pieces = [torch.empty_like(local) for _ in range(world_size(group))]
    dist.all_gather(pieces, local, group=group)
    return [p.to(tensor.device) for p in pieces]


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor (every rank of its mesh must call it); plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


# -------------------------------------------------------------------- objects
def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Global rank ``src``'s ``obj`` on every rank (pickled over the group's CPU backend: trusted peers only)."""
    if not active(group):
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    if not active(group):
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_object(obj: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's ``obj`` on global rank ``dst`` (``None`` on the others); ``[obj]`` on a single process."""
    if not active(group):
        return [obj]
    import torch.distributed as dist

    out = [None] * world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=group)
    return out


def barrier(group: Any = None) -> None:
    """Wait until every rank of ``group`` arrives."""
    if active(group):
        import torch.distributed as dist

        dist.barrier(group=group)


# ------------------------------------------------------------------ agreement
def failed_ranks(ok: bool, group: Any = None) -> list[int]:
    """The ranks of ``group`` whose ``ok`` is False (every rank learns the same list)."""
    flags = all_gather_object(bool(ok), group)
    return [r for r, flag in enumerate(flags) if not flag]


def agree(ok: bool, what: str, group: Any = None) -> None:
    """Every rank learns whether all succeeded; the ranks that did raise too, naming the failed ones.

    The failing ranks raise their own error after this returns, so every rank leaves together
    instead of the healthy ones hanging in the next collective.
    """
    failed = failed_ranks(ok, group)
    if failed and ok:
        raise RuntimeError(f"{what} failed on rank(s) {failed}; this rank stopped too (see their error).")


# ------------------------------------------------------------ side channel
_BACKGROUND_GROUP: Any = None


def background_group() -> Any:
    """A second CPU (gloo) group of every rank, for collectives made off the main thread.

    torch.distributed.checkpoint's ``async_save`` ends with a gather in its writer thread; on the
    world group it would interleave with the training's own collectives (a size mismatch inside
    gloo). ``None`` on a single process. Made on first use: every rank must call it at the same point.
    """
    global _BACKGROUND_GROUP
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return None
    try:
        if _BACKGROUND_GROUP is not None and dist.get_world_size(_BACKGROUND_GROUP) == dist.get_world_size():
            return _BACKGROUND_GROUP
    except (RuntimeError, ValueError):  # the groups were destroyed and made again since
        pass
    _BACKGROUND_GROUP = dist.new_group(backend="gloo")
    return _BACKGROUND_GROUP
