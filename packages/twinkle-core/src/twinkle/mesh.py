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
#: the order in which upstream Twinkle's ``from_sizes`` names the axes of its rank array
UPSTREAM_ORDER: tuple[str, ...] = ("fsdp", "pp", "dp", "cp", "tp")
_EP_HINT = " (expert parallelism is not an axis here: give ep_size=, which divides dp*fsdp*cp)"
DATA_DIMS: tuple[str, ...] = ("dp", "fsdp")


def _env_world_size() -> int | None:
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


@dataclass(frozen=True, init=False)
class DeviceMesh:
    """Named sizes of every parallel dimension plus helpers to find a rank's place in them.

    Built two ways: from sizes (``DeviceMesh.from_sizes(dp_size=2, tp_size=2)``, or the size keywords
    here), whose ranks are laid out row-major over ``(pp, dp, fsdp, cp, tp)``; or, as upstream Twinkle and
    torch do, from an array of global ranks with one named axis per dimension
    (``DeviceMesh(mesh=np.arange(8).reshape(2, 4), mesh_dim_names=('dp', 'tp'))``), any layout.

    ``mesh``/``mesh_dim_names`` then present the ranks in the declared order (for a mesh from sizes:
    upstream's ``fsdp, pp, dp, cp, tp`` order over the dimensions given, with dp always present), and the
    current-rank properties (``dp_rank``, ``tp_rank``, ...; ``None`` for a dimension not declared or a
    process outside the mesh) answer for :meth:`twinkle.Platform.get_rank`.

    Args:
        mesh: an array (numpy, torch, nested lists) of distinct global ranks, one axis per dimension.
        mesh_dim_names: the dimension of each axis of ``mesh``: names from ``pp, dp, fsdp, cp, tp``.
        pp_size, dp_size, fsdp_size, cp_size, tp_size: sizes when no ``mesh`` is given (default 1).
        ep_size: expert parallelism, carved out of ``dp x fsdp x cp`` (it must divide that product).
        sequence_parallel: Megatron sequence parallelism along the TP group (needs ``tp_size > 1``).
        vpp_size: virtual pipeline stages per rank (Megatron), or None.
        device_type: torch device type for :meth:`to_torch`; None detects the platform.
        extra: further backend options carried along.
        ranks: the global rank at each row-major ``(pp, dp, fsdp, cp, tp)`` position (as stored; None
            means the position itself). Give ``mesh`` instead.
    """

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
    ranks: tuple[int, ...] | None = None
    mesh_dim_names: tuple[str, ...] = ()

    def __init__(self, mesh: Any = None, mesh_dim_names: Sequence[str] | None = None, *, pp_size: int = 1,
                 dp_size: int = 1, fsdp_size: int = 1, cp_size: int = 1, tp_size: int = 1, ep_size: int = 1,
                 sequence_parallel: bool = False, vpp_size: int | None = None, device_type: str | None = None,
                 extra: Mapping[str, Any] | None = None, ranks: Sequence[int] | None = None) -> None:
        sizes = {"pp": pp_size, "dp": dp_size, "fsdp": fsdp_size, "cp": cp_size, "tp": tp_size}
        if mesh is not None:
            if ranks is not None or any(v != 1 for v in sizes.values()):
                raise ValueError("DeviceMesh: give either mesh= (a rank array; its shape gives the sizes) or sizes, "
                                 "not both.")
            sizes, ranks, mesh_dim_names = _from_rank_array(mesh, mesh_dim_names)
        values = dict(pp_size=sizes["pp"], dp_size=sizes["dp"], fsdp_size=sizes["fsdp"], cp_size=sizes["cp"],
                      tp_size=sizes["tp"], ep_size=ep_size, sequence_parallel=sequence_parallel, vpp_size=vpp_size,
                      device_type=device_type, extra=dict(extra or {}))
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check_sizes()
        object.__setattr__(self, "ranks", self._checked_ranks(ranks))
        object.__setattr__(self, "mesh_dim_names", self._checked_names(mesh_dim_names))

    def _check_sizes(self) -> None:
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

    def _checked_ranks(self, ranks: Sequence[int] | None) -> tuple[int, ...] | None:
        if ranks is None:
            return None
        ranks = tuple(ranks)
        if len(ranks) != self.world_size:
            raise ValueError(f"DeviceMesh: {len(ranks)} ranks given for a mesh of {self.world_size} positions.")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
            raise ValueError(f"DeviceMesh: the ranks must be distinct non-negative integers, got {list(ranks)[:16]}.")
        return None if ranks == tuple(range(len(ranks))) else ranks

    def _checked_names(self, names: Sequence[str] | None) -> tuple[str, ...]:
        if names is None:  # the dimensions in use, in upstream's order; dp is always one
            return tuple(d for d in UPSTREAM_ORDER if d == "dp" or self.size(d) > 1)
        names = tuple(names)
        unknown = [n for n in names if n not in DIMS]
        if unknown or len(set(names)) != len(names):
            raise ValueError(f"DeviceMesh: mesh_dim_names {names} must be distinct names from {', '.join(DIMS)}"
                             f"{_EP_HINT if 'ep' in unknown else ''}.")
        hidden = [d for d in DIMS if d not in names and self.size(d) > 1]
        if hidden:
            raise ValueError(f"DeviceMesh: mesh_dim_names {names} leave out {hidden}, of size > 1.")
        return names

    # ------------------------------------------------------------ construction
    @classmethod
    def from_sizes(
        cls,
        dp_size: int | None = None,
        fsdp_size: int | None = None,
        tp_size: int | None = None,
        pp_size: int | None = None,
        cp_size: int | None = None,
        ep_size: int | None = None,
        sequence_parallel: bool = False,
        vpp_size: int | None = None,
        world_size: int | None = None,
        device_type: str | None = None,
        ulysses_size: int | None = None,
        etp_size: int | None = None,
        ep_fsdp_size: int | None = None,
        **extra: Any,
    ) -> DeviceMesh:
        """Build a mesh from per-dimension sizes (a size left None is 1, and not in ``mesh_dim_names``).

        ``dp_size=None`` fills the data-parallel dimension with whatever the world size leaves
        (world size from ``world_size`` or the ``WORLD_SIZE`` variable, else 1 replica). A world
        size that the sizes do not multiply to is an error naming both numbers. Upstream's
        ``ulysses_size`` and ``etp_size`` are accepted at 1 only (no Ulysses or expert-TP dimension
        here), ``ep_fsdp_size`` only at the value it must have, ``dp_size*fsdp_size*cp_size/ep_size``.

        Returns:
            The mesh, its ranks laid out row-major over ``(pp, dp, fsdp, cp, tp)``.
        """
        for name, value in (("ulysses_size", ulysses_size), ("etp_size", etp_size)):
            if value not in (None, 1):
                raise ValueError(f"DeviceMesh: {name}={value!r} is not supported: there is no "
                                 f"{name[:-5]} dimension here. Use cp_size for context parallelism, tp_size for "
                                 "tensor parallelism (experts included), or leave it at 1.")
        given = {"fsdp": fsdp_size, "pp": pp_size, "dp": dp_size, "cp": cp_size, "tp": tp_size}
        world = world_size if world_size is not None else _env_world_size()
        others = {d: 1 if given[d] is None else given[d] for d in ("fsdp", "tp", "pp", "cp")}
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
        names = tuple(d for d in UPSTREAM_ORDER if d == "dp" or given[d] is not None)
        mesh = cls(
            pp_size=others["pp"], dp_size=dp_size, fsdp_size=others["fsdp"], cp_size=others["cp"],
            tp_size=others["tp"], ep_size=1 if ep_size is None else ep_size, sequence_parallel=sequence_parallel,
            vpp_size=vpp_size, device_type=device_type, extra=dict(extra), mesh_dim_names=names,
        )
        pool = mesh.dp_size * mesh.fsdp_size * mesh.cp_size
        if ep_fsdp_size is not None and ep_fsdp_size != pool // mesh.ep_size:
            raise ValueError(f"DeviceMesh: ep_fsdp_size={ep_fsdp_size!r}, but experts are sharded over "
                             f"dp*fsdp*cp={pool} ranks in ep_size={mesh.ep_size} groups, so it is "
                             f"{pool // mesh.ep_size}; leave it out.")
        if world is not None:
            mesh.check_world_size(world)
        return mesh

    @classmethod
    def from_torch(cls, torch_mesh: TorchDeviceMesh, **options: Any) -> DeviceMesh:
        """The twinkle mesh of a ``torch.distributed.device_mesh.DeviceMesh`` (same ranks, names, device type).

        ``options`` are the other keywords of the constructor (``ep_size``, ``sequence_parallel``...).
        """
        names = torch_mesh.mesh_dim_names
        if not names:
            raise ValueError("DeviceMesh.from_torch: the torch mesh has no mesh_dim_names; build it with "
                             f"mesh_dim_names= naming each axis from {', '.join(DIMS)}.")
        options.setdefault("device_type", torch_mesh.device_type)
        return cls(mesh=torch_mesh.mesh.tolist(), mesh_dim_names=names, **options)

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

    @property
    def mesh(self) -> Any:
        """The global ranks as a numpy array with one axis per name of ``mesh_dim_names``, in that order."""
        return self._rank_array(self.mesh_dim_names)

    def _rank_array(self, names: Sequence[str]) -> Any:
        """The ranks with one axis per dimension of ``names`` (which holds every dimension of size > 1)."""
        import numpy as np

        canonical = np.asarray(self.ranks if self.ranks is not None else range(self.world_size)).reshape(self.shape)
        order = [DIMS.index(d) for d in names]
        order += [i for i in range(len(DIMS)) if i not in order]  # the size-1 rest, dropped by the reshape
        return canonical.transpose(order).reshape([self.size(d) for d in names])

    def has_dim(self, dim_name: str) -> bool:
        """Whether ``dim_name`` is one of ``mesh_dim_names``."""
        return dim_name in self.mesh_dim_names

    def get_dim_size(self, dim_name: str) -> int:
        """The size of a dimension of ``mesh_dim_names``."""
        if dim_name not in self.mesh_dim_names:
            raise ValueError(f"Dimension {dim_name!r} is not in this mesh; its dimensions: {self.mesh_dim_names}.")
        return self.size(dim_name)

    # ------------------------------------------------------------ coordinates
    def _position(self, rank: int) -> int:
        if self.ranks is None:
            if not 0 <= rank < self.world_size:
                raise ValueError(f"rank {rank} is outside this mesh of {self.world_size} processes.")
            return rank
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in this mesh of ranks {sorted(self.ranks)[:16]}.") from None

    def _rank_at(self, position: int) -> int:
        return position if self.ranks is None else self.ranks[position]

    def __contains__(self, rank: int) -> bool:
        return (0 <= rank < self.world_size) if self.ranks is None else rank in self.ranks

    def _coords_at(self, position: int) -> dict[str, int]:
        out: dict[str, int] = {}
        rem = position
        for dim in reversed(DIMS):
            size = self.size(dim)
            out[dim] = rem % size
            rem //= size
        ordered = {d: out[d] for d in DIMS}
        ordered["ep"] = self._expert_rank(ordered)
        return ordered

    def coords(self, rank: int) -> dict[str, int]:
        """``{'pp': .., 'dp': .., 'fsdp': .., 'cp': .., 'tp': .., 'ep': ..}`` of one global rank."""
        return self._coords_at(self._position(rank))

    def _expert_rank(self, coords: Mapping[str, int]) -> int:
        flat = (coords["dp"] * self.fsdp_size + coords["fsdp"]) * self.cp_size + coords["cp"]
        return flat % self.ep_size

    def rank_of(self, **coords: int) -> int:
        """The global rank at the given coordinates (missing dimensions count as 0)."""
        unknown = set(coords) - set(DIMS)
        if unknown:
            raise KeyError(f"unknown mesh dimensions {sorted(unknown)}; dimensions: {', '.join(DIMS)}.")
        position = 0
        for dim in DIMS:
            value = coords.get(dim, 0)
            if not 0 <= value < self.size(dim):
                raise ValueError(f"{dim} coordinate {value} is outside 0..{self.size(dim) - 1}.")
            position = position * self.size(dim) + value
        return self._rank_at(position)

    def data_rank_of(self, rank: int) -> int:
        """Which data shard a rank reads: its index in dp x fsdp."""
        c = self.coords(rank)
        return c["dp"] * self.fsdp_size + c["fsdp"]

    @property
    def data_rank(self) -> DataRank:
        """This process's data shard (upstream's property; 0 outside the mesh, as upstream).

        Calling it, ``mesh.data_rank(rank)``, gives any rank's shard (:meth:`data_rank_of`), as before.
        """
        rank = self._current_rank()
        return DataRank(self.data_rank_of(rank) if rank in self else 0, self)

    def group_ranks(self, dims: str | Sequence[str], rank: int) -> list[int]:
        """Ranks that share every coordinate with ``rank`` except along ``dims`` (its process group)."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        for dim in dims:
            if dim not in DIMS:
                raise KeyError(f"DeviceMesh has no dimension {dim!r}; dimensions: {', '.join(DIMS)}.")
        base = self.coords(rank)
        return [
            self._rank_at(p) for p in range(self.world_size)
            if all(self._coords_at(p)[d] == base[d] for d in DIMS if d not in dims)
        ]

    def get_slice(self, total_length: int, rank: int | None = None) -> slice:
        """The part of ``total_length`` items that data rank ``rank`` (default: this process's) reads.

        Contiguous near-equal parts, the first ``total_length % data_world_size`` one item longer.
        """
        world = self.data_world_size
        rank = int(self.data_rank) if rank is None else rank
        size, extra = divmod(total_length, world)
        start = rank * size + min(rank, extra)
        return slice(start, start + size + (rank < extra))

    # ------------------------------------------------------- the current rank
    @staticmethod
    def _current_rank() -> int:
        from twinkle.platform import Platform

        return Platform.get_rank()

    def _current(self, dim: str) -> int | None:
        if dim != "ep" and dim not in self.mesh_dim_names:
            return None
        rank = self._current_rank()
        if rank not in self:
            return None
        if dim == "ep" and self.ep_size == 1:
            return None
        return self.coords(rank)[dim]

    dp_rank = property(lambda self: self._current("dp"), doc="This process's dp coordinate (None if absent).")
    fsdp_rank = property(lambda self: self._current("fsdp"), doc="This process's fsdp coordinate (None if absent).")
    tp_rank = property(lambda self: self._current("tp"), doc="This process's tp coordinate (None if absent).")
    pp_rank = property(lambda self: self._current("pp"), doc="This process's pp coordinate (None if absent).")
    cp_rank = property(lambda self: self._current("cp"), doc="This process's cp coordinate (None if absent).")
    ep_rank = property(lambda self: self._current("ep"), doc="This process's expert-parallel rank (None if ep=1).")
    dp_world_size = property(lambda self: self.dp_size, doc="Size of the dp dimension.")
    fsdp_world_size = property(lambda self: self.fsdp_size, doc="Size of the fsdp dimension.")
    tp_world_size = property(lambda self: self.tp_size, doc="Size of the tp dimension.")
    pp_world_size = property(lambda self: self.pp_size, doc="Size of the pp dimension.")
    cp_world_size = property(lambda self: self.cp_size, doc="Size of the cp dimension.")
    ep_world_size = property(lambda self: self.ep_size, doc="Expert-parallel size.")

    # ---------------------------------------------------------------- torch
    def to_torch(self, device_type: str | None = None, dims: Sequence[str] | None = None) -> TorchDeviceMesh:
        """An initialised ``torch.distributed.device_mesh.DeviceMesh`` over the named dimensions.

        ``dims`` defaults to the dimensions larger than 1 (or ``('dp',)`` on a single process);
        the remaining dimensions must all be of size 1.
        """
        wanted = tuple(dims) if dims is not None else tuple(d for d in DIMS if self.size(d) > 1) or ("dp",)
        dropped = [d for d in DIMS if d not in wanted and self.size(d) > 1]
        if dropped:
            raise ValueError(f"to_torch(dims={wanted}) would drop dimensions {dropped} of size > 1.")
        ordered = tuple(d for d in DIMS if d in wanted)
        device = device_type or self.device_type or _default_device_type()
        if self.ranks is None:
            from torch.distributed.device_mesh import init_device_mesh

            return init_device_mesh(device, tuple(self.size(d) for d in ordered), mesh_dim_names=ordered)
        return self._torch_mesh(device, ordered)

    def to_torch_device_mesh(self) -> TorchDeviceMesh:
        """The torch mesh over ``mesh_dim_names`` in their order, with these ranks (upstream's name)."""
        return self._torch_mesh(self.device_type or _default_device_type(), self.mesh_dim_names)

    def _torch_mesh(self, device: str, names: Sequence[str]) -> TorchDeviceMesh:
        import torch
        from torch.distributed.device_mesh import DeviceMesh as TorchMesh

        return TorchMesh(device, torch.as_tensor(self._rank_array(names)), mesh_dim_names=tuple(names))

    def describe(self) -> str:
        active = [f"{d}={self.size(d)}" for d in DIMS if self.size(d) > 1]
        if self.ep_size > 1:
            active.append(f"ep={self.ep_size}")
        if self.sequence_parallel:
            active.append("sequence_parallel")
        return f"DeviceMesh({', '.join(active) or 'single process'}; world={self.world_size})"


class DataRank(int):
    """The current process's data rank (an int) that, called with a rank, gives that rank's instead.

    Upstream Twinkle reads ``mesh.data_rank`` as a property; twinkle's callers call ``mesh.data_rank(rank)``.
    """

    def __new__(cls, value: int, mesh: DeviceMesh) -> DataRank:
        obj = super().__new__(cls, value)
        obj._mesh = mesh
        return obj

    def __call__(self, rank: int) -> int:
        return self._mesh.data_rank_of(rank)

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (to a Ray worker) as the plain int it is
        return int, (int(self),)


def _from_rank_array(mesh: Any, names: Sequence[str] | None) -> tuple[dict[str, int], list[int], tuple[str, ...]]:
    """Sizes, row-major ``(pp, dp, fsdp, cp, tp)`` ranks and names of a rank array with named axes."""
    import numpy as np

    array = np.asarray(mesh.tolist() if hasattr(mesh, "tolist") and not isinstance(mesh, np.ndarray) else mesh)
    if names is None:
        raise ValueError("DeviceMesh(mesh=...) needs mesh_dim_names=, one name per axis of the rank array, "
                         f"from {', '.join(DIMS)}.")
    names = tuple(names)
    if len(names) != array.ndim:
        raise ValueError(f"DeviceMesh: the rank array has {array.ndim} axes (shape {array.shape}) but "
                         f"mesh_dim_names has {len(names)}: {names}.")
    unknown = [n for n in names if n not in DIMS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"DeviceMesh: mesh_dim_names {names} must be distinct names from {', '.join(DIMS)}"
                         f"{_EP_HINT if 'ep' in unknown else ''}.")
    if array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"DeviceMesh: mesh must be a non-empty array of integer ranks, got dtype {array.dtype} "
                         f"and shape {array.shape}.")
    sizes = {d: (array.shape[names.index(d)] if d in names else 1) for d in DIMS}
    present = [names.index(d) for d in DIMS if d in names]
    canonical = array.transpose(present).reshape([sizes[d] for d in DIMS])
    return sizes, [int(r) for r in canonical.reshape(-1)], names


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
