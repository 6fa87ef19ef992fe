"""``@remote_class`` / ``@remote_function``: how a component runs when it is driven remotely.

In ray mode a decorated class becomes a group of actors placed on the devices of its
``remote_group`` and each decorated method says how inputs are dispatched to the actors and how
their results are collected. In local mode (torchrun) every process already holds its own
instance, so both decorators are transparent: the class only records its ``remote_group`` and
methods run as written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from twinkle.actors.dispatch import COLLECT, DISPATCH, EXECUTE, RemoteClassSpec, RemoteFunctionSpec
from twinkle.actors.worker import in_actor
from twinkle.runtime import Runtime, get_runtime
from twinkle.utils.checks import check_choice

T = TypeVar("T", bound=type)
F = TypeVar("F", bound=Callable[..., Any])


def remote_function(
    dispatch: str = "all", execute: str = "all", collect: str = "first", sync: bool = True
) -> Callable[[F], F]:
    """Mark a method of a remote class with its dispatch/execute/collect policy."""
    check_choice(dispatch, "dispatch", DISPATCH)
    check_choice(execute, "execute", EXECUTE)
    check_choice(collect, "collect", COLLECT)
    spec = RemoteFunctionSpec(dispatch, execute, collect, sync)

    def decorate(fn: F) -> F:
        fn.__twinkle_remote__ = spec  # type: ignore[attr-defined]
        return fn

    return decorate


def remote_class(execute: str = "all") -> Callable[[T], T]:
    """Let a component class take ``remote_group=`` and be placed on that group's devices.

    The constructor accepts ``remote_group`` (a group declared in ``twinkle.initialize``). In ray
    mode the driver gets a proxy whose methods run on one actor per rank of that group; in local
    mode (and inside those actors) the object is built as usual and ``self.remote_group`` records
    the group, which must exist if groups were declared.
    """
    check_choice(execute, "execute", EXECUTE)
    spec = RemoteClassSpec(execute)

    def decorate(cls: T) -> T:
        original_init = cls.__init__
        original_new = cls.__new__

        def __new__(klass: type, *args: Any, remote_group: str | None = None, **kwargs: Any) -> Any:
            runtime = get_runtime()
            if runtime.mode == "ray" and not in_actor():
                return _make_remote(runtime, klass, remote_group, args, kwargs)
            if original_new is object.__new__:
                return object.__new__(klass)
            return original_new(klass, *args, **kwargs)

        @functools.wraps(original_init)
        def __init__(self, *args: Any, remote_group: str | None = None, **kwargs: Any) -> None:
            if remote_group is not None:
                runtime = get_runtime()
                if runtime.groups:
                    runtime.group(remote_group)
            self.remote_group = remote_group
            original_init(self, *args, **kwargs)

        cls.__new__ = staticmethod(__new__)  # type: ignore[assignment]
        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.__twinkle_remote__ = spec  # type: ignore[attr-defined]
        return cls

    return decorate


def _make_remote(runtime: Runtime, cls: type, remote_group: str | None, args: tuple, kwargs: dict) -> Any:
    """Build ``cls`` as actors on ``remote_group`` (ray mode)."""
    from twinkle.actors.proxy import RemoteGroupProxy

    if remote_group is None:
        if len(runtime.groups) != 1:
            known = ", ".join(runtime.groups)
            raise ValueError(f"{cls.__name__}(...) in ray mode needs remote_group=...; declared groups: {known}.")
        remote_group = next(iter(runtime.groups))
    group = runtime.group(remote_group)
    return RemoteGroupProxy(cls, group, runtime.group_mesh(remote_group), runtime.cluster, args, kwargs,
                            seed=runtime.seed, timeout_s=runtime.timeout_s)
