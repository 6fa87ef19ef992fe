"""``twinkle.initialize``: bind this process to its rank, platform, mesh and seed.

``mode='local'`` is one process per rank, launched by ``torchrun`` (or a single plain process);
torch.distributed is initialised with the platform's collective backend (gloo on CPU, nccl on
CUDA, hccl on Ascend). ``mode='ray'`` drives components as Ray actors.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from twinkle.errors import TwinkleError
from twinkle.log import get_logger
from twinkle.mesh import DeviceGroup, DeviceMesh

MODES = ("local", "ray")


@dataclass
class Runtime:
    """What ``initialize`` decided; ``get_runtime()`` returns it to any component that asks."""

    mode: str = "local"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    platform: str = "cpu"
    device_mesh: DeviceMesh = field(default_factory=DeviceMesh)
    groups: dict[str, DeviceGroup] = field(default_factory=dict)
    seed: int | None = None
    initialized: bool = False

    @property
    def data_rank(self) -> int:
        return self.device_mesh.data_rank(self.rank)

    def group(self, name: str) -> DeviceGroup:
        if name not in self.groups:
            known = ", ".join(self.groups) or "(none declared)"
            raise KeyError(
                f"No device group named {name!r}; declared groups: {known}. Pass it in initialize(groups=[...])."
            )
        return self.groups[name]


_runtime = Runtime()


def get_runtime() -> Runtime:
    return _runtime


def get_device_mesh() -> DeviceMesh:
    return _runtime.device_mesh


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (every device) with one number."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_groups(groups: Sequence[DeviceGroup], world_size: int, mode: str) -> dict[str, DeviceGroup]:
    by_name: dict[str, DeviceGroup] = {}
    for group in groups:
        if not isinstance(group, DeviceGroup):
            raise TypeError(f"groups must hold DeviceGroup objects, got {type(group).__name__}.")
        if group.name in by_name:
            raise ValueError(f"Two device groups are named {group.name!r}; group names must be unique.")
        if mode == "local" and max(group.ranks) >= world_size:
            raise ValueError(
                f"DeviceGroup {group.name!r} uses rank {max(group.ranks)} but only {world_size} processes were "
                "launched; in local mode groups must fit inside the torchrun world."
            )
        by_name[group.name] = group
    return by_name


def initialize(
    mode: str = "local",
    global_device_mesh: DeviceMesh | None = None,
    groups: Sequence[DeviceGroup] | None = None,
    seed: int | None = None,
    *,
    device: str | None = None,
    timeout_s: float | None = None,
) -> Runtime:
    """Set up this process for training and return the :class:`Runtime`.

    Under ``torchrun`` (``WORLD_SIZE > 1``) this initialises torch.distributed with the detected
    platform's backend unless it already is. The mesh must cover exactly the launched processes.
    """
    global _runtime
    if mode not in MODES:
        raise ValueError(f"initialize(mode={mode!r}): mode must be one of {', '.join(MODES)}.")
    if mode == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise ImportError("mode='ray' needs Ray: pip install 'twinkle-core[ray]'") from exc
        raise TwinkleError(
            "mode='ray' is not available in twinkle-core 0.1.0 yet; launch with torchrun and mode='local'."
        )

    from twinkle.platform import detect_platform

    platform = detect_platform(device)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    mesh = global_device_mesh or DeviceMesh.from_sizes(world_size=world_size)
    mesh.check_world_size(world_size)
    group_table = _check_groups(groups or (), world_size, mode)

    platform.set_device(local_rank)
    if world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
            dist.init_process_group(backend=platform.dist_backend, rank=rank, world_size=world_size, **kwargs)
    if seed is not None:
        seed_everything(seed)

    _runtime = Runtime(
        mode=mode, rank=rank, world_size=world_size, local_rank=local_rank, platform=platform.name,
        device_mesh=mesh, groups=group_table, seed=seed, initialized=True,
    )
    get_logger().debug("initialized %s on %s (rank %d/%d)", mesh.describe(), platform.name, rank, world_size)
    return _runtime
