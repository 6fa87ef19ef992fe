"""Starting or joining the Ray cluster, and one placement group per DeviceGroup."""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from twinkle.mesh import DeviceGroup

_RESOURCE = {"cpu": "CPU", "cuda": "GPU", "gpu": "GPU"}


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("mode='ray' needs Ray: pip install 'twinkle-core[ray]'") from exc
    return ray


@dataclass
class Cluster:
    """What ray mode started: whether we own the Ray session, placement groups, live proxies."""

    started_ray: bool = False
    placement_groups: dict[str, Any] = field(default_factory=dict)
    proxies: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    def bundle(self, group: DeviceGroup) -> dict[str, float]:
        resource = _RESOURCE.get(group.device_type, group.device_type.upper())
        return {resource: 1.0} if resource == "CPU" else {"CPU": 1.0, resource: 1.0}

    def placement_group(self, group: DeviceGroup, timeout_s: float = 60.0) -> Any:
        """One bundle per rank of ``group``, reserved once and reused by every component on it."""
        ray = import_ray()
        from ray.util.placement_group import placement_group

        if group.name not in self.placement_groups:
            pg = placement_group([self.bundle(group)] * group.world_size, strategy="PACK")
            if not pg.wait(timeout_s):
                available = ray.available_resources()
                raise RuntimeError(
                    f"Ray could not reserve {group.world_size} x {self.bundle(group)} for device group "
                    f"{group.name!r} within {timeout_s:.0f}s; the cluster has {available}. Shrink the group "
                    "or add nodes."
                )
            self.placement_groups[group.name] = pg
        return self.placement_groups[group.name]

    def shutdown(self) -> None:
        for proxy in list(self.proxies):
            proxy.close()
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups.values():
            remove_placement_group(pg)
        self.placement_groups.clear()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()


def start(address: str | None, num_cpus: int | None, ray_init_kwargs: dict[str, Any] | None = None) -> Cluster:
    """Join ``address`` (or the running session), else start a local Ray instance.

    Workers get the driver's ``sys.path`` so classes from the user's own modules unpickle there.
    """
    ray = import_ray()
    if ray.is_initialized():
        return Cluster(started_ray=False)
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    kwargs: dict[str, Any] = {"include_dashboard": False, "runtime_env": {"env_vars": env_vars}}
    if address is not None:
        kwargs["address"] = address
    elif num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    kwargs.update(ray_init_kwargs or {})
    ray.init(**kwargs)
    return Cluster(started_ray=True)
