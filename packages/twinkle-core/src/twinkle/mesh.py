"""DeviceMesh: every parallel dimension named, with rank arithmetic that needs no torch.

Ranks are laid out row-major over ``(pp, dp, fsdp, cp, tp)``: tensor parallel varies fastest, so
the ranks of one TP group are adjacent (one node), as in Megatron's ``tp-cp-dp-pp`` order. The
data-parallel dimension seen by the DataLoader is ``dp x fsdp``: ranks that differ only in tp, cp
or pp coordinates read the same data. Expert parallelism is carved out of ``dp x fsdp x cp`` (the
Megatron convention), so ``ep_size`` must divide that product instead of multiplying the world.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

DIMS: tuple[str, ...] = ("pp", "dp", "fsdp", "cp", "tp")
DATA_DIMS: tuple[str, ...] = ("dp", "fsdp")


def _env_world_size() -> int | None:
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


@dataclass(frozen=True)
class DeviceMesh:
    """Named sizes of every parallel dimension plus helpers to find a rank's place in them."""

    pp_size: int = 1
    dp_size: int = 1
    fsdp_size: int = 1
    cp_size: int = 1
    tp_size: int = 1
    ep_size: int = 1
    sequence_parallel: bool = False
    vpp_size: int | None = None
    device_type: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for dim in (*DIMS, "ep"):
            value = getattr(self, f"{dim}_size")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DeviceMesh: {dim}_size must be an integer >= 1, got {value!r}.")
        if self.vpp_size is not None and (not isinstance(self.vpp_size, int) or self.vpp_size < 1):
            raise ValueError(f"DeviceMesh: vpp_size must be None or an integer >= 1, got {self.vpp_size!r}.")
        expert_pool = self.dp_size * self.fsdp_size * self.cp_size
        if expert_pool % self.ep_size:
            raise ValueError(
                f"DeviceMesh: ep_size={self.ep_size} must divide dp_size*fsdp_size*cp_size={expert_pool} "
                "(experts are sharded across the data-parallel and context-parallel ranks)."
            )
        if self.sequence_parallel and self.tp_size == 1:
            raise ValueError("DeviceMesh: sequence_parallel=True needs tp_size > 1 (it shards along the TP group).")

    # ------------------------------------------------------------ construction
    @classmethod
    def from_sizes(
        cls,
        dp_size: int | None = None,
        fsdp_size: int = 1,
        tp_size: int = 1,
        pp_size: int = 1,
        cp_size: int = 1,
        ep_size: int = 1,
        sequence_parallel: bool = False,
        vpp_size: int | None = None,
        world_size: int | None = None,
        device_type: str | None = None,
        **extra: Any,
    ) -> DeviceMesh:
        """Build a mesh from per-dimension sizes.

        ``dp_size=None`` fills the data-parallel dimension with whatever the world size leaves
        (world size from ``world_size`` or the ``WORLD_SIZE`` variable, else 1 replica). A world
        size that the sizes do not multiply to is an error naming both numbers.
        """
        world = world_size if world_size is not None else _env_world_size()
        others = {"fsdp": fsdp_size, "tp": tp_size, "pp": pp_size, "cp": cp_size}
        for name, value in others.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DeviceMesh: {name}_size must be an integer >= 1, got {value!r}.")
        rest = math.prod(others.values())
        if dp_size is None:
            if world is None:
                dp_size = 1
            elif world % rest:
                raise ValueError(
                    f"DeviceMesh: world size {world} is not divisible by fsdp*tp*pp*cp={rest}; "
                    "choose sizes whose product divides the number of processes."
                )
            else:
                dp_size = world // rest
        mesh = cls(
            pp_size=pp_size, dp_size=dp_size, fsdp_size=fsdp_size, cp_size=cp_size, tp_size=tp_size,
            ep_size=ep_size, sequence_parallel=sequence_parallel, vpp_size=vpp_size,
            device_type=device_type, extra=dict(extra),
        )
        if world is not None:
            mesh.check_world_size(world)
        return mesh

    def check_world_size(self, world_size: int) -> None:
        if self.world_size != world_size:
            sizes = " * ".join(f"{d}={self.size(d)}" for d in DIMS)
            raise ValueError(
                f"DeviceMesh: {sizes} = {self.world_size} processes, but the world size is {world_size}. "
                f"Change the sizes so their product is {world_size}, or launch {self.world_size} processes."
            )

    # ----------------------------------------------------------------- shape
    @property
    def dim_names(self) -> tuple[str, ...]:
        return DIMS

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.size(d) for d in DIMS)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: str) -> int:
        if dim == "ep":
            return self.ep_size
        if dim == "data":
            return self.data_world_size
        if dim not in DIMS:
            raise KeyError(f"DeviceMesh has no dimension {dim!r}; dimensions: {', '.join((*DIMS, 'ep', 'data'))}.")
        return getattr(self, f"{dim}_size")

    @property
    def data_world_size(self) -> int:
        """How many different data shards exist: dp x fsdp."""
        return self.dp_size * self.fsdp_size

    # ------------------------------------------------------------ coordinates
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside this mesh of {self.world_size} processes.")

    def coords(self, rank: int) -> dict[str, int]:
        """``{'pp': .., 'dp': .., 'fsdp': .., 'cp': .., 'tp': .., 'ep': ..}`` of one global rank."""
        self._check_rank(rank)
        out: dict[str, int] = {}
        rem = rank
        for dim in reversed(DIMS):
            size = self.size(dim)
            out[dim] = rem % size
            rem //= size
        ordered = {d: out[d] for d in DIMS}
        ordered["ep"] = self._expert_rank(ordered)
        return ordered

    def _expert_rank(self, coords: Mapping[str, int]) -> int:
        flat = (coords["dp"] * self.fsdp_size + coords["fsdp"]) * self.cp_size + coords["cp"]
        return flat % self.ep_size

    def rank_of(self, **coords: int) -> int:
        """The global rank at the given coordinates (missing dimensions count as 0)."""
        unknown = set(coords) - set(DIMS)
        if unknown:
            raise KeyError(f"unknown mesh dimensions {sorted(unknown)}; dimensions: {', '.join(DIMS)}.")
        rank = 0
        for dim in DIMS:
            value = coords.get(dim, 0)
            if not 0 <= value < self.size(dim):
                raise ValueError(f"{dim} coordinate {value} is outside 0..{self.size(dim) - 1}.")
            rank = rank * self.size(dim) + value
        return rank

    def data_rank(self, rank: int) -> int:
        """Which data shard a rank reads: its index in dp x fsdp."""
        c = self.coords(rank)
        return c["dp"] * self.fsdp_size + c["fsdp"]

    def group_ranks(self, dims: str | Sequence[str], rank: int) -> list[int]:
        """Ranks that share every coordinate with ``rank`` except along ``dims`` (its process group)."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        for dim in dims:
            if dim not in DIMS:
                raise KeyError(f"DeviceMesh has no dimension {dim!r}; dimensions: {', '.join(DIMS)}.")
        base = self.coords(rank)
        ranks = [
            r for r in range(self.world_size)
            if all(self.coords(r)[d] == base[d] for d in DIMS if d not in dims)
        ]
        return ranks

    # ---------------------------------------------------------------- torch
    def to_torch(self, device_type: str | None = None, dims: Sequence[str] | None = None) -> TorchDeviceMesh:
        """An initialised ``torch.distributed.device_mesh.DeviceMesh`` over the named dimensions.

        ``dims`` defaults to the dimensions larger than 1 (or ``('dp',)`` on a single process);
        the remaining dimensions must all be of size 1.
        """
        from torch.distributed.device_mesh import init_device_mesh

        wanted = tuple(dims) if dims is not None else tuple(d for d in DIMS if self.size(d) > 1) or ("dp",)
        dropped = [d for d in DIMS if d not in wanted and self.size(d) > 1]
        if dropped:
            raise ValueError(f"to_torch(dims={wanted}) would drop dimensions {dropped} of size > 1.")
        ordered = tuple(d for d in DIMS if d in wanted)
        device = device_type or self.device_type or _default_device_type()
        return init_device_mesh(device, tuple(self.size(d) for d in ordered), mesh_dim_names=ordered)

    def describe(self) -> str:
        active = [f"{d}={self.size(d)}" for d in DIMS if self.size(d) > 1]
        if self.ep_size > 1:
            active.append(f"ep={self.ep_size}")
        if self.sequence_parallel:
            active.append("sequence_parallel")
        return f"DeviceMesh({', '.join(active) or 'single process'}; world={self.world_size})"


def _default_device_type() -> str:
    from twinkle.platform import detect_platform

    return detect_platform().device_type


@dataclass(frozen=True)
class DeviceGroup:
    """A named set of ranks (a Ray placement group in ray mode) that components can be bound to.

    ``ranks`` may be an int (that many ranks, numbered from 0) or explicit global ranks.
    """

    name: str
    ranks: Sequence[int] | int
    device_type: str = "cpu"
    device_mesh: DeviceMesh | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("DeviceGroup needs a non-empty name.")
        ranks = list(range(self.ranks)) if isinstance(self.ranks, int) else list(self.ranks)
        if not ranks or any((not isinstance(r, int)) or r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
            raise ValueError(
                f"DeviceGroup {self.name!r}: ranks must be distinct non-negative ints, got {self.ranks!r}."
            )
        object.__setattr__(self, "ranks", tuple(ranks))
        if self.device_mesh is not None and self.device_mesh.world_size != len(ranks):
            raise ValueError(
                f"DeviceGroup {self.name!r}: its mesh has {self.device_mesh.world_size} processes "
                f"but the group has {len(ranks)} ranks."
            )

    @property
    def world_size(self) -> int:
        return len(self.ranks)
