"""``twinkle.initialize``: bind this process to its rank, platform, mesh and seed.

``mode='local'`` is one process per rank, launched by ``torchrun`` (or a single plain process);
torch.distributed is initialised with the platform's collective backend (gloo on CPU, nccl on
CUDA, hccl on Ascend). ``mode='ray'`` drives components as Ray actors.
"""

from __future__ import annotations

import atexit
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from twinkle.log import get_logger
from twinkle.mesh import DeviceGroup, DeviceMesh

MODES = ("local", "ray")
#: The process group's timeout when ``timeout_s`` is not given. torch's NCCL default (10 minutes) is shorter than
#: a full-model save of a large model can keep the other ranks waiting in the next collective (rank 0 writing
#: the consolidated weights and the manifest); half an hour covers writing ~100 GB at 100 MB/s.
DEFAULT_PROCESS_GROUP_TIMEOUT_S = 1800.0


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
    cluster: Any = None  # ray mode: twinkle.actors.cluster.Cluster
    timeout_s: float | None = None

    @property
    def data_rank(self) -> int:
        return self.device_mesh.data_rank_of(self.rank)

    def group(self, name: str) -> DeviceGroup:
        if name not in self.groups:
            known = ", ".join(self.groups) or "(none declared)"
            raise KeyError(
                f"No device group named {name!r}; declared groups: {known}. Pass it in initialize(groups=[...])."
            )
        return self.groups[name]

    def group_mesh(self, name: str) -> DeviceMesh:
        """The mesh of a group's ranks (ray mode fills one in for every group at initialize)."""
        group = self.group(name)
        return group.device_mesh or self.device_mesh


_runtime = Runtime()


def get_runtime() -> Runtime:
    return _runtime


def get_device_mesh() -> DeviceMesh:
    return _runtime.device_mesh


def env_local_rank() -> int:
    """The launcher's local rank: ``LOCAL_RANK`` (torchrun), else ``RANK``, else 0 (a plain process)."""
    return int(os.environ.get("LOCAL_RANK") or os.environ.get("RANK") or 0)


def local_rank() -> int:
    """This process's device index on its node: ``initialize``'s, or the launcher's when it has not run.

    A torchrun script may skip ``initialize`` (a MegatronModel brings torch.distributed up itself);
    every rank must still pick its own device, not device 0.
    """
    return _runtime.local_rank if _runtime.initialized else env_local_rank()


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


def process_group_timeout(timeout_s: float | None = None) -> timedelta:
    """The timeout of the process groups twinkle creates: ``timeout_s``, else one sized for checkpoint writes."""
    return timedelta(seconds=timeout_s or DEFAULT_PROCESS_GROUP_TIMEOUT_S)


def initialize(
    mode: str = "local",
    global_device_mesh: DeviceMesh | None = None,
    groups: Sequence[DeviceGroup] | None = None,
    seed: int | None = None,
    *,
    device: str | None = None,
    timeout_s: float | None = None,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    backend: str | None = None,
) -> Runtime:
    """Set up this process for training and return the :class:`Runtime`.

    local: under ``torchrun`` (``WORLD_SIZE > 1``) this initialises torch.distributed with the
    detected platform's backend unless it already is; the mesh must cover exactly the launched
    processes (``backend`` replaces the platform's, e.g. ``'gloo'`` or ``'cpu:gloo,cuda:nccl'``). ray: this process
    is the driver; it starts (or joins ``ray_address``) a Ray cluster,
    and each ``@remote_class`` component built with ``remote_group=`` becomes one actor per rank of
    that group. ``timeout_s`` bounds collectives (local; default :data:`DEFAULT_PROCESS_GROUP_TIMEOUT_S`) and
    remote calls (ray).
    """
    global _runtime
    if mode not in MODES:
        raise ValueError(f"initialize(mode={mode!r}): mode must be one of {', '.join(MODES)}.")
    # Everything is validated before the previous runtime is touched: a bad call changes nothing.
    if mode == "ray":
        table = _ray_groups(global_device_mesh, groups)
        from twinkle.actors.cluster import import_ray

        import_ray()
        _stop_cluster()
        from twinkle.actors.cluster import start

        cluster = start(ray_address, num_cpus)
        if seed is not None:
            seed_everything(seed)
        _runtime = Runtime(mode="ray", device_mesh=global_device_mesh or DeviceMesh(), groups=table, seed=seed,
                           initialized=True, cluster=cluster, timeout_s=timeout_s)
        return _runtime

    from twinkle.platform import detect_platform

    platform = detect_platform(device)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = env_local_rank()
    mesh = global_device_mesh or DeviceMesh.from_sizes(world_size=world_size)
    mesh.check_world_size(world_size)
    group_table = _check_groups(groups or (), world_size, mode)
    _stop_cluster()

    bound = platform.bind(local_rank)
    if world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend=backend or platform.dist_backend, rank=rank, world_size=world_size, **bound,
                                    timeout=process_group_timeout(timeout_s))
            # A script should not have to remember destroy_process_group; see _close_process_groups.
            atexit.register(_close_process_groups)
    if seed is not None:
        seed_everything(seed)

    _runtime = Runtime(
        mode=mode, rank=rank, world_size=world_size, local_rank=local_rank, platform=platform.name,
        device_mesh=mesh, groups=group_table, seed=seed, initialized=True, timeout_s=timeout_s,
    )
    get_logger().debug("initialized %s on %s (rank %d/%d)", mesh.describe(), platform.name, rank, world_size)
    return _runtime


def _ray_groups(mesh: DeviceMesh | None, groups: Sequence[DeviceGroup] | None) -> dict[str, DeviceGroup]:
    """Every group with a mesh of its own size: its own, else the global mesh, else dp over its ranks."""
    if not groups:
        groups = [DeviceGroup("default", mesh.world_size if mesh else 1)]
    table = _check_groups(groups, world_size=0, mode="ray")
    for name, group in table.items():
        group_mesh = group.device_mesh or mesh or DeviceMesh.from_sizes(world_size=group.world_size)
        if group_mesh.world_size != group.world_size:
            raise ValueError(
                f"DeviceGroup {group.name!r} has {group.world_size} ranks but global_device_mesh covers "
                f"{group_mesh.world_size}; give the group its own device_mesh or match the sizes."
            )
        table[name] = replace(group, device_mesh=group_mesh)
    return table


def shutdown() -> None:
    """Stop what ``initialize`` started: Ray actors and a Ray session we began, or the process group."""
    global _runtime
    if _runtime.cluster is not None:
        _runtime.cluster.shutdown()
    elif _runtime.initialized and _runtime.world_size > 1:
        _close_process_groups()
    _runtime = Runtime()


def _stop_cluster() -> None:
    """Before a new initialize: stop a previous Ray runtime; a process group stays for reuse."""
    global _runtime
    if _runtime.cluster is not None:
        _runtime.cluster.shutdown()
        _runtime = Runtime()


def _close_process_groups() -> None:
    """Destroy the process groups, then let the collective backend's threads go idle while Python is alive.

    Why both: gloo runs each collective on a worker thread, and that thread drops its reference to
    the collective's tensors only after the caller has already been told the collective finished.
    Dropping a tensor that Python also knows needs the GIL. If the interpreter starts finalizing
    first, that thread is killed inside a C++ destructor: "terminate called without an active
    exception" and SIGABRT at exit, more often the busier the machine. destroy_process_group alone
    does not stop those threads: a torch DeviceMesh, DDP or FSDP module still holding the group
    keeps it (and its threads) alive until the final garbage collection.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        wait_for_idle_threads()


def wait_for_idle_threads(timeout_s: float = 5.0, pause_s: float = 0.01) -> bool:
    """Sleep (the GIL released) until no other thread of this process is runnable, twice in a row.

    Reads thread states from ``/proc/self/task`` (Linux); elsewhere it only sleeps ``pause_s`` a few
    times. Returns False if some thread was still busy after ``timeout_s``.
    """
    import threading
    import time
    from pathlib import Path

    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(3 * pause_s)
        return True
    me = str(threading.get_native_id())
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(pause_s)
        quiet = quiet + 1 if not _busy_threads(tasks, me) else 0
    return True


def _busy_threads(tasks: Any, me: str) -> list[str]:
    """Thread ids other than ``me`` that are running, runnable or in uninterruptible I/O."""
    busy = []
    for task in tasks.iterdir():
        if task.name == me:
            continue
        try:
            state = (task / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state in ("R", "D"):
            busy.append(task.name)
    return busy
