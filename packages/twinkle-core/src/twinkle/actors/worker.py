"""The body of one Ray actor: a process that behaves exactly like one torchrun rank."""

from __future__ import annotations

import os
import socket
from typing import Any

from twinkle.runtime import initialize

ACTOR_ENV = "TWINKLE_RAY_ACTOR"


def in_actor() -> bool:
    """True inside a twinkle actor process, where remote classes are built as plain objects."""
    return os.environ.get(ACTOR_ENV) == "1"


class RankWorker:
    """Holds one rank's instance of a remote class and runs its methods."""

    def __init__(self, rank: int, world_size: int, group: str) -> None:
        os.environ[ACTOR_ENV] = "1"
        self.rank, self.world_size, self.group = rank, world_size, group
        self.instance: Any = None

    def address(self) -> tuple[str, int]:
        """This node's address and a free port, for rank 0 to host torch.distributed's store."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int, mesh: Any, seed: int | None, device: str | None) -> int:
        """Set the torchrun variables and initialise twinkle in local mode inside this actor."""
        os.environ.update({
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        })
        initialize(mode="local", global_device_mesh=mesh, seed=seed, device=device)
        return os.getpid()

    def construct(self, cls: type, args: tuple, kwargs: dict) -> str:
        self.instance = cls(*args, **kwargs)
        return type(self.instance).__name__

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.instance, name)(*args, **kwargs)

    def get(self, name: str) -> Any:
        return getattr(self.instance, name)

    def read(self, path: tuple[tuple[str, Any], ...], keys: bool = False) -> Any:
        """The value at ``path`` (``('.', attribute)`` / ``('[]', key)`` steps) of the instance, or its keys."""
        value = self.instance
        for kind, key in path:
            value = getattr(value, key) if kind == "." else value[key]
        return list(value) if keys else value

    def write(self, path: tuple[tuple[str, Any], ...], name: str, value: Any) -> None:
        """Set attribute ``name`` of the object at ``path`` of the instance to ``value``."""
        setattr(self.read(path), name, value)

    def apply(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(instance, *args, **kwargs)`` on this rank's instance."""
        return fn(self.instance, *args, **kwargs)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
