"""Reading and writing slot parameters whether they are plain tensors or FSDP2 shards (DTensor).

Under FSDP2 a parameter is a DTensor sharded over ranks; slot resets, rank zeroing and adapter
save/load work on the full tensor, so they are collectives: every rank must call them together
(the SPMD rule every tenant call follows anyway).
"""

from __future__ import annotations

import torch


def is_sharded(param: torch.Tensor) -> bool:
    return hasattr(param, "full_tensor") and hasattr(param, "device_mesh")


def full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor (all-gathered under FSDP2)."""
    return param.full_tensor() if is_sharded(param) else param


@torch.no_grad()
def assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """Write the full ``value`` into ``param`` (this rank's shard of it under FSDP2)."""
    if is_sharded(param):
        from torch.distributed.tensor import distribute_tensor

        shard = distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(value)
