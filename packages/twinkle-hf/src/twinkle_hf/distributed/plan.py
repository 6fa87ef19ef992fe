"""Which wrapping a TransformersModel gets, decided from the world size, the DeviceMesh and ``strategy``.

Every check runs before a weight is read, so a wrong launch fails in a second with a message
naming the numbers and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from twinkle.log import get_logger
from twinkle.mesh import DeviceMesh
from twinkle.utils.checks import check_choice

logger = get_logger("twinkle_hf")

STRATEGIES = ("accelerate", "native_fsdp")
#: What the plan decided: no wrapping, torch DDP, native FSDP2 (maybe HSDP), accelerate's FSDP2, tensor parallel.
KINDS = ("none", "ddp", "fsdp2", "accelerate_fsdp2", "tp")


@dataclass(frozen=True)
class DistributedPlan:
    """The wrapping of one model and the mesh it spans (``distributed``, ``sharded``, ``hsdp`` derived once).

    ``sharded`` means FSDP2 (parameters sharded over the data ranks). ``tp_size > 1`` shards the layers'
    weights over the tensor-parallel ranks too (kind "tp" alone, "fsdp2" for FSDP2 x TP); those ranks read
    the same data, so one step sees ``data_size`` = world / tp different batches.
    """

    kind: str
    world_size: int
    dp_size: int = 1
    fsdp_size: int = 1
    tp_size: int = 1
    ep_size: int = 1
    distributed: bool = field(init=False)
    sharded: bool = field(init=False)
    hsdp: bool = field(init=False)
    #: the layers' weights split over ``tp_size`` ranks (alone or under FSDP2)
    tensor_parallel: bool = field(init=False)
    #: each MoE layer's experts split over ``ep_size`` of the data ranks (under FSDP2)
    expert_parallel: bool = field(init=False)

    def __post_init__(self) -> None:
        sharded = self.kind in ("fsdp2", "accelerate_fsdp2")
        object.__setattr__(self, "distributed", self.kind != "none")
        object.__setattr__(self, "sharded", sharded)
        object.__setattr__(self, "hsdp", sharded and self.dp_size > 1 and self.fsdp_size > 1)
        # fields, not properties: the step reads them, and a read should not enter this file (tests/engine)
        object.__setattr__(self, "tensor_parallel", self.tp_size > 1)
        object.__setattr__(self, "expert_parallel", self.ep_size > 1)

    @property
    def data_size(self) -> int:
        """How many different batches one step sees: the ranks that do not share their data (dp x fsdp)."""
        return self.world_size // self.tp_size


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def make_plan(strategy: str, mesh: DeviceMesh | None, world_size: int | None = None) -> DistributedPlan:
    """The plan for ``strategy`` over ``mesh`` on ``world_size`` processes (default ``WORLD_SIZE``)."""
    check_choice(strategy, "strategy", STRATEGIES)
    world = env_world_size() if world_size is None else world_size
    if mesh is None:
        mesh = DeviceMesh.from_sizes(world_size=world)
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"device_mesh must be a twinkle DeviceMesh, got {type(mesh).__name__}.")
    others = {d: mesh.size(d) for d in ("pp", "cp") if mesh.size(d) > 1}
    if others:
        raise ValueError(f"TransformersModel shards over dp, fsdp and tp only; the mesh has {others}. Use "
                         "MegatronModel (twinkle-megatron) for pipeline/context parallelism, or set those sizes to 1.")
    if mesh.ep_size > 1:
        return _ep_plan(mesh, strategy, world)
    if mesh.tp_size > 1:
        return _tp_plan(mesh, strategy, world)
    if world % mesh.fsdp_size:
        raise ValueError(f"fsdp_size={mesh.fsdp_size} does not divide the world size {world}; pick an fsdp_size "
                         f"that divides {world} (e.g. {world}) or launch a multiple of {mesh.fsdp_size} processes.")
    if mesh.world_size != world:
        raise ValueError(f"The DeviceMesh covers dp={mesh.dp_size} x fsdp={mesh.fsdp_size} = {mesh.world_size} "
                         f"processes but {world} were launched (WORLD_SIZE). Use "
                         f"DeviceMesh.from_sizes(fsdp_size={mesh.fsdp_size}) to fill dp from the world size, or "
                         f"launch {mesh.world_size} processes.")
    if world == 1:
        return DistributedPlan("none", 1)
    if mesh.fsdp_size == 1:
        return DistributedPlan("ddp", world, dp_size=mesh.dp_size)
    kind = "fsdp2" if strategy == "native_fsdp" else "accelerate_fsdp2"
    if strategy == "accelerate" and mesh.dp_size > 1:
        logger.info("strategy='accelerate' with dp=%d x fsdp=%d: HSDP (replicate x shard) runs on torch's native "
                    "FSDP2 (fully_shard over a 2-D mesh); fsdp_config takes its keys.", mesh.dp_size, mesh.fsdp_size)
        kind = "fsdp2"
    return DistributedPlan(kind, world, dp_size=mesh.dp_size, fsdp_size=mesh.fsdp_size)


def _tp_plan(mesh: DeviceMesh, strategy: str, world: int) -> DistributedPlan:
    """Tensor parallelism over the ``tp`` ranks, alone ("tp") or under FSDP2 on the dp x fsdp ranks ("fsdp2").

    FSDP2 x TP is torchtitan's 2-D layout: TP inside each ``tp`` group (adjacent ranks), ``fully_shard`` of
    the tensor-parallel weights over the ``fsdp`` ranks (HSDP when ``dp_size > 1`` too). DDP x TP is not
    built: FSDP2 over the same ranks does the data-parallel part.
    """
    if mesh.sequence_parallel:
        raise ValueError("TransformersModel does not run sequence_parallel=True with tp (activations stay "
                         "replicated between the layers); set sequence_parallel=False.")
    if mesh.world_size != world:
        raise ValueError(f"The DeviceMesh covers dp={mesh.dp_size} x fsdp={mesh.fsdp_size} x tp={mesh.tp_size} = "
                         f"{mesh.world_size} processes but {world} were launched (WORLD_SIZE). Launch "
                         f"{mesh.world_size} processes, or use DeviceMesh.from_sizes(tp_size={mesh.tp_size}, "
                         f"fsdp_size={max(world // mesh.tp_size, 1)}).")
    if mesh.fsdp_size == 1 and mesh.dp_size > 1:
        raise ValueError(f"TransformersModel does not run DDP x tensor parallelism (dp_size={mesh.dp_size} x "
                         f"tp_size={mesh.tp_size}): use fsdp_size={mesh.dp_size} instead of dp_size (FSDP2 x TP), "
                         f"or dp_size with fsdp_size > 1 (HSDP x TP).")
    if mesh.fsdp_size == 1:
        return DistributedPlan("tp", world, tp_size=mesh.tp_size)
    if strategy == "accelerate":
        logger.info("strategy='accelerate' with fsdp=%d x tp=%d: FSDP2 x TP runs on torch's native FSDP2 "
                    "(fully_shard over the fsdp dimension of a 2-D mesh); fsdp_config takes its keys.",
                    mesh.fsdp_size, mesh.tp_size)
    return DistributedPlan("fsdp2", world, dp_size=mesh.dp_size, fsdp_size=mesh.fsdp_size, tp_size=mesh.tp_size)


def _ep_plan(mesh: DeviceMesh, strategy: str, world: int) -> DistributedPlan:
    """Expert parallelism carved out of the FSDP2 data ranks: ``ep_size`` of them split each layer's experts."""
    if mesh.tp_size > 1:
        raise ValueError(f"TransformersModel does not run expert x tensor parallelism (ep_size={mesh.ep_size} x "
                         f"tp_size={mesh.tp_size}) yet: use ep_size with fsdp_size (FSDP2 x EP) and tp_size=1, or "
                         "tp_size with fsdp_size and ep_size=1.")
    if mesh.fsdp_size == 1:
        raise ValueError(f"TransformersModel runs expert parallelism under FSDP2 only: ep_size={mesh.ep_size} with "
                         f"dp_size={mesh.dp_size} x fsdp_size=1. Use fsdp_size={mesh.dp_size} instead of dp_size.")
    if mesh.world_size != world:
        raise ValueError(f"The DeviceMesh covers dp={mesh.dp_size} x fsdp={mesh.fsdp_size} = {mesh.world_size} "
                         f"processes but {world} were launched (WORLD_SIZE). Launch {mesh.world_size} processes, "
                         f"or use DeviceMesh.from_sizes(fsdp_size={world}, ep_size={mesh.ep_size}).")
    if strategy == "accelerate":
        logger.info("strategy='accelerate' with ep=%d: FSDP2 x EP runs on torch's native FSDP2 (fully_shard with the "
                    "expert weights left out); fsdp_config takes its keys.", mesh.ep_size)
    return DistributedPlan("fsdp2", world, dp_size=mesh.dp_size, fsdp_size=mesh.fsdp_size, ep_size=mesh.ep_size)


def check_process_group(plan: DistributedPlan) -> None:
    """A multi-process plan needs torch.distributed up: ``twinkle.initialize()`` does it under torchrun."""
    if not plan.distributed:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"WORLD_SIZE={plan.world_size} but torch.distributed is not initialised: call "
                           "twinkle.initialize(global_device_mesh=...) before building TransformersModel.")


NATIVE_FSDP_KEYS = ("reshard_after_forward", "reduce_dtype")
#: ``fsdp_config`` keys twinkle itself reads, under either FSDP2 strategy (never passed to torch/accelerate).
TWINKLE_FSDP_KEYS = ("sync_each_microbatch",)


def own_fsdp_keys(fsdp_config: dict) -> dict:
    """``fsdp_config`` without twinkle's own keys: what torch's ``fully_shard`` or accelerate's plugin receive."""
    return {k: v for k, v in fsdp_config.items() if k not in TWINKLE_FSDP_KEYS}


def check_configs(strategy: str, ddp_config: dict | None, fsdp_config: dict | None) -> None:
    """Unknown ``ddp_config`` / ``fsdp_config`` keys fail at construction, not at the first step."""
    import dataclasses
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    accepted = set(inspect.signature(DistributedDataParallel.__init__).parameters) - {"self", "module"}
    unknown = sorted(set(ddp_config or {}) - accepted)
    if unknown:
        raise ValueError(f"ddp_config keys {unknown} are not DistributedDataParallel arguments; it takes e.g. "
                         "bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view, static_graph.")
    if strategy == "native_fsdp":
        allowed = set(NATIVE_FSDP_KEYS)
    else:
        from accelerate.utils import FullyShardedDataParallelPlugin

        allowed = {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}
    allowed |= set(TWINKLE_FSDP_KEYS)
    value = (fsdp_config or {}).get("sync_each_microbatch", True)
    if not isinstance(value, bool):
        raise ValueError(f"fsdp_config['sync_each_microbatch'] must be True (reduce-scatter every micro-batch, "
                         f"gradients stay sharded) or False (no communication until the boundary), got {value!r}.")
    unknown = sorted(set(fsdp_config or {}) - allowed)
    if unknown:
        raise ValueError(f"fsdp_config keys {unknown} are not understood by strategy={strategy!r}; it takes "
                         f"{', '.join(sorted(allowed)[:12])}{' ...' if len(allowed) > 12 else ''}.")
