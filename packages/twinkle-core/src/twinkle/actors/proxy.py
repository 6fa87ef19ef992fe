"""The driver-side stand-in for a remote class: one actor per rank, calls fanned out and collected."""

from __future__ import annotations

import time
from typing import Any

from twinkle.actors import dispatch
from twinkle.actors.cluster import Cluster
from twinkle.actors.dispatch import RemoteFunctionSpec, remote_spec
from twinkle.actors.worker import RankWorker
from twinkle.errors import TwinkleError
from twinkle.mesh import DeviceGroup, DeviceMesh

DEFAULT_SPEC = RemoteFunctionSpec()
SHARE = 0.01
#: Attributes a proxy reads live from rank 0 (a :class:`LiveView`) instead of copying them once; setting an
#: attribute through the view sets it on every rank (``model.model._no_split_modules = [...]``).
LIVE_ATTRIBUTES = ("optimizer_group", "model")


class RemoteActorError(TwinkleError, RuntimeError):
    """A rank raised inside a remote call; the message names the rank and carries its traceback."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


class RemoteGroupProxy:
    """Looks like an instance of ``cls``; each method call runs on the group's actors.

    Every rank runs in its own actor process with torch.distributed initialised among them, so
    the class's code is the same as under torchrun. Any rank's failure kills the group (ranks
    stuck in a collective would otherwise wait forever) and is raised here naming the rank.
    """

    def __init__(self, cls: type, group: DeviceGroup, mesh: DeviceMesh, cluster: Cluster, args: tuple,
                 kwargs: dict, *, seed: int | None = None, timeout_s: float | None = None) -> None:
        import ray

        self._cls, self._group, self._mesh, self._timeout = cls, group, mesh, timeout_s
        self._closed = False
        pg = cluster.placement_group(group)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_cls = ray.remote(RankWorker)
        # A small share of each bundle, so several components can live on one group's devices.
        share = {k: SHARE for k in cluster.bundle(group)}
        custom = {k: v for k, v in share.items() if k not in ("CPU", "GPU")}
        self._actors = [
            actor_cls.options(
                num_cpus=share.get("CPU", 0), num_gpus=share.get("GPU", 0), resources=custom or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
            ).remote(rank, group.world_size, group.name)
            for rank in range(group.world_size)
        ]
        cluster.proxies.add(self)
        addr, port = self._gather([self._actors[0].address.remote()], "address")[0]
        device = None if group.device_type == "gpu" else group.device_type
        self._gather([a.setup.remote(addr, port, mesh, seed, device) for a in self._actors], "setup")
        self._gather([a.construct.remote(cls, args, kwargs) for a in self._actors], "__init__")

    # ---------------------------------------------------------------- calls
    def _gather(self, refs: list[Any], what: str, ranks: list[int] | None = None) -> list[Any]:
        """Wait for every ref; on the first failure kill the group and raise naming the rank."""
        import ray

        ranks = ranks if ranks is not None else list(range(len(refs)))
        pending = dict(zip(refs, ranks))
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not done:
                self.close()
                raise RemoteActorError(
                    f"{self._cls.__name__}.{what} on group {self._group.name!r} did not finish within "
                    f"{self._timeout}s on ranks {sorted(pending.values())}; the group was stopped.",
                    rank=min(pending.values()),
                )
            ref = done[0]
            try:
                ray.get(ref)
            except Exception as exc:
                rank = pending[ref]
                self.close()
                raise RemoteActorError(
                    f"{self._cls.__name__}.{what} failed on rank {rank} of group {self._group.name!r} "
                    f"(the group was stopped):\n{exc}",
                    rank=rank,
                ) from None
            del pending[ref]
        return ray.get(refs)

    def _call(self, name: str, spec: RemoteFunctionSpec, args: tuple, kwargs: dict) -> Any:
        if self._closed:
            raise TwinkleError(f"The {self._cls.__name__} actors of group {self._group.name!r} were stopped.")
        what = f"{self._cls.__name__}.{name}"
        plan = dispatch.plan_calls(spec.dispatch, spec.execute, self._mesh, args, kwargs, what)
        refs = [self._actors[rank].call.remote(name, a, k) for rank, _, a, k in plan]
        results = self._gather(refs, name, [rank for rank, _, _, _ in plan])
        shards = None if spec.dispatch == "all" else [shard for _, shard, _, _ in plan]
        return dispatch.collect(spec.collect, results, shards)

    def _read(self, path: tuple[tuple[str, Any], ...], keys: bool = False) -> Any:
        """The value at ``path`` on rank 0's instance now (``keys``: its keys), for :class:`LiveView`."""
        if self._closed:
            raise TwinkleError(f"The {self._cls.__name__} actors of group {self._group.name!r} were stopped.")
        return self._gather([self._actors[0].read.remote(path, keys)], "read")[0]

    def _write(self, path: tuple[tuple[str, Any], ...], name: str, value: Any) -> None:
        """Set ``name`` on the object at ``path`` of every rank's instance, for :class:`LiveView`."""
        if self._closed:
            raise TwinkleError(f"The {self._cls.__name__} actors of group {self._group.name!r} were stopped.")
        self._gather([a.write.remote(path, name, value) for a in self._actors], f"setting {name}")

    def run_on_ranks(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(instance, *args, **kwargs)`` on every rank's instance (in the actors); returns rank 0's result.

        How a function that changes a model in place reaches the actors: ``kernelize(model)`` on a
        proxy runs this way. ``fn`` and its arguments are pickled to the actors.
        """
        if self._closed:
            raise TwinkleError(f"The {self._cls.__name__} actors of group {self._group.name!r} were stopped.")
        name = getattr(fn, "__name__", "function")
        return self._gather([a.apply.remote(fn, args, kwargs) for a in self._actors], name)[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in LIVE_ATTRIBUTES:
            return LiveView(self, ((".", name),))
        attr = getattr(self._cls, name, None)
        if attr is None or not callable(attr):  # plain attributes are read from rank 0
            return self._gather([self._actors[0].get.remote(name)], name)[0]
        spec = remote_spec(attr) if isinstance(remote_spec(attr), RemoteFunctionSpec) else DEFAULT_SPEC

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, spec, args, kwargs)

        method.__name__ = name
        return method

    @property
    def remote_group(self) -> str:
        return self._group.name

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def close(self) -> None:
        """Stop this group's actors (idempotent)."""
        if self._closed:
            return
        self._closed = True
        import ray

        for actor in self._actors:
            ray.kill(actor, no_restart=True)

    def __repr__(self) -> str:
        state = "stopped" if self._closed else f"{self._group.world_size} actors"
        return f"<remote {self._cls.__name__} on group {self._group.name!r}: {state}>"


class LiveView:
    """A live view of an attribute of rank 0's instance: every read asks the actor, so it is never stale.

    ``proxy.optimizer_group['default'].cur_step`` is the step the model is at now, as it is for a
    local model. Indexing gives another view; an attribute read returns its current value (a copy);
    setting an attribute sets it on every rank (``proxy.model._no_split_modules = [...]``).
    """

    def __init__(self, proxy: RemoteGroupProxy, path: tuple[tuple[str, Any], ...]) -> None:
        object.__setattr__(self, "_proxy", proxy)
        object.__setattr__(self, "_path", path)

    def __setattr__(self, name: str, value: Any) -> None:
        """Set the attribute on every rank's object (``model.model._no_split_modules = [...]`` in ray mode)."""
        self._proxy._write(self._path, name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # Python's protocols (copy, pickle) ask the view, not the actor
            raise AttributeError(name)
        return self._proxy._read((*self._path, (".", name)))

    def __getitem__(self, key: Any) -> LiveView:
        if key not in self:
            raise KeyError(key)
        return LiveView(self._proxy, (*self._path, ("[]", key)))

    def keys(self) -> list[Any]:
        return self._proxy._read(self._path, keys=True)

    def __iter__(self) -> Any:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: Any) -> bool:
        return key in self.keys()

    def __repr__(self) -> str:
        where = "".join(f".{k}" if kind == "." else f"[{k!r}]" for kind, k in self._path)
        return f"<live view of rank 0's {self._proxy._cls.__name__}{where}>"
