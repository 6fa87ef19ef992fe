"""Writing one checkpoint directory from many ranks: one temporary directory, one rename.

Rank 0 opens twinkle-core's :func:`atomic_directory` and broadcasts its temporary path; every rank
writes its files there; then all ranks agree (an all-reduce of "did it work") and rank 0 renames
the directory into place, or deletes it if any rank failed. Multi-node runs need the output
directory on a shared filesystem.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from twinkle.checkpoint import CheckpointError, atomic_directory


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist else 0


def world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist else 1


def _agree(ok: bool, device: torch.device) -> bool:
    dist = _dist()
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@contextmanager
def shared_atomic_directory(final: Path, device: torch.device) -> Iterator[Path]:
    """Like ``atomic_directory`` but the same temporary directory on every rank."""
    dist = _dist()
    if dist is None:
        with atomic_directory(final) as tmp:
            yield tmp
        return
    manager = atomic_directory(final) if dist.get_rank() == 0 else None
    box = [str(manager.__enter__())] if manager is not None else [None]
    dist.broadcast_object_list(box, src=0)
    ok = False
    try:
        yield Path(box[0])
        ok = True
    finally:
        everyone = _agree(ok, device)
        if manager is not None:
            if everyone:
                manager.__exit__(None, None, None)
            else:
                manager.__exit__(CheckpointError, CheckpointError("a rank failed while saving"), None)
    if not everyone:
        raise CheckpointError(f"Another rank failed while saving {str(final)!r}; nothing was written.")


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere); a one-element list on a single process."""
    dist = _dist()
    if dist is None:
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
