"""How one call's arguments are split across a group's ranks and how their results are combined.

The policies a ``@remote_function`` names (:class:`RemoteFunctionSpec`) live here with the code that
carries them out.

Pure functions over plain data (lists, tuples, dicts, tensors, numbers): no Ray here, so the
rules are testable on their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.mesh import DeviceMesh

DISPATCH = ("all", "slice", "slice_dp")
EXECUTE = ("all", "first", "rank0")
COLLECT = ("none", "first", "list", "flatten", "mean", "sum")


@dataclass(frozen=True)
class RemoteFunctionSpec:
    """How one method is called across the actors of its group.

    dispatch: ``all`` sends the same arguments to every actor, ``slice`` splits list-like
    arguments evenly across actors, ``slice_dp`` splits them by data-parallel rank (tp/pp peers
    get the same slice). execute: ``all`` actors, only the ``first`` one, or ``rank0``.
    collect: ``none``, the ``first`` result, a ``list`` per actor, ``flatten`` lists, ``mean``/``sum``
    of numbers.
    """

    dispatch: str = "all"
    execute: str = "all"
    collect: str = "first"
    sync: bool = True


@dataclass(frozen=True)
class RemoteClassSpec:
    """Options of a remote class: ``execute`` as in :class:`RemoteFunctionSpec` for its constructor."""

    execute: str = "all"


def remote_spec(obj: Any) -> RemoteFunctionSpec | RemoteClassSpec | None:
    """The remote policy attached to a class or method, if any."""
    return getattr(obj, "__twinkle_remote__", None)


def _length(value: Any) -> int | None:
    """Row count of a sliceable batch-like value, None for scalars and strings."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    if isinstance(value, Mapping):
        lengths = {_length(v) for v in value.values()}
        lengths.discard(None)
        return lengths.pop() if len(lengths) == 1 else None
    if hasattr(value, "shape") and getattr(value, "ndim", 0) > 0:
        return int(value.shape[0])
    if isinstance(value, Sequence):
        return len(value)
    return None


def _take(value: Any, part: int, parts: int) -> Any:
    if isinstance(value, Mapping):
        return {k: _take(v, part, parts) if _length(v) is not None else v for k, v in value.items()}
    return value[part::parts]


def split(value: Any, parts: int, what: str) -> list[Any]:
    """``parts`` equal strided slices (rows ``r::parts``, as the DataLoader gives each rank under
    torchrun) of a batch-like value; scalars are repeated. Uneven sizes are an error."""
    n = _length(value)
    if n is None:
        return [value] * parts
    if n % parts:
        raise ValueError(
            f"{what} has {n} rows, which does not divide evenly over {parts} data-parallel ranks; "
            f"use a batch size that is a multiple of {parts}."
        )
    return [_take(value, i, parts) for i in range(parts)]


def plan_calls(
    dispatch: str, execute: str, mesh: DeviceMesh, args: tuple, kwargs: dict, what: str
) -> list[tuple[int, int | None, tuple, dict]]:
    """``(rank, shard, args, kwargs)`` for every rank that runs this call (shard None: not split)."""
    ranks = list(range(mesh.world_size)) if execute == "all" else [0]
    if dispatch == "all":
        return [(r, None, args, kwargs) for r in ranks]
    parts = mesh.world_size if dispatch == "slice" else mesh.data_world_size
    split_args = [split(a, parts, f"{what} argument {i}") for i, a in enumerate(args)]
    split_kwargs = {k: split(v, parts, f"{what} argument {k!r}") for k, v in kwargs.items()}
    plan = []
    for r in ranks:
        shard = r if dispatch == "slice" else mesh.data_rank_of(r)
        plan.append((r, shard, tuple(a[shard] for a in split_args), {k: v[shard] for k, v in split_kwargs.items()}))
    return plan


def _mean_or_sum(values: list[Any], how: str) -> Any:
    first = values[0]
    if isinstance(first, Mapping):
        return {k: _mean_or_sum([v[k] for v in values], how) for k in first}
    total = sum(values[1:], first)
    return total / len(values) if how == "mean" else total


def collect(how: str, results: list[Any], shards: list[int] | None = None) -> Any:
    """Combine per-rank results (in rank order) as a ``remote_function(collect=...)`` asked.

    ``shards`` gives, per result, the slice its rank received (None when arguments were not
    split). ``flatten`` then puts rows back in their original order, and ``flatten``/``sum`` count
    each slice once (tp/pp peers of a data rank return the same rows).
    """
    if how == "none":
        return None
    if how == "first":
        return results[0]
    if how == "list":
        return list(results)
    if shards is not None and how in ("flatten", "sum"):
        first_of_shard = {}
        for shard, result in zip(shards, results):
            first_of_shard.setdefault(shard, result)
        results = [first_of_shard[k] for k in sorted(first_of_shard)]
    if how == "flatten":
        if shards is None:
            return [item for result in results for item in result]
        merged: list[Any] = [None] * sum(len(r) for r in results)
        for part, result in enumerate(results):
            merged[part::len(results)] = list(result)
        return merged
    return _mean_or_sum(results, how)
