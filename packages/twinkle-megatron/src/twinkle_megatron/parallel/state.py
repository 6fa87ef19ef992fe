"""Bring up torch.distributed and megatron-core's (process-global) parallel state for a mesh.

megatron-core keeps one set of process groups per process; a second MegatronModel with the same
sizes reuses them and one with different sizes is refused (call :func:`destroy` first). The
data-parallel group (with context parallelism) is registered with ``twinkle.collective``, so
metrics and token counts are summed over data ranks only, not over TP/PP peers.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from twinkle import collective
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.parallel.mesh import ParallelSizes

_current: ParallelSizes | None = None


def ensure_process_group(device_type: str) -> None:
    """torch.distributed on with the platform's backend (``gloo`` on CPU, ``cpu:gloo,cuda:nccl`` on CUDA: object
    collectives keep a CPU path); a single process gets a private file store.

    Without ``twinkle.initialize`` (a plain torchrun script) the process is bound to the device of its
    ``LOCAL_RANK`` first, and on an accelerator the group gets that device as ``device_id``.
    """
    import torch.distributed as dist

    from twinkle.platform import detect_platform
    from twinkle.runtime import local_rank, process_group_timeout

    if dist.is_initialized():
        return
    platform = detect_platform(device_type)
    bound = platform.bind(local_rank())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=platform.dist_backend, rank=int(os.environ.get("RANK", "0")),
                                world_size=world, timeout=process_group_timeout(), **bound)
        return
    store = tempfile.NamedTemporaryFile(prefix="twinkle-megatron-", delete=False)
    store.close()
    dist.init_process_group(backend=platform.dist_backend, init_method=f"file://{store.name}", rank=0, world_size=1,
                            **bound)


def initialize(sizes: ParallelSizes, device_type: str) -> None:
    """``parallel_state.initialize_model_parallel`` for ``sizes`` (idempotent for equal sizes)."""
    global _current
    import torch.distributed as dist
    from megatron.core import parallel_state

    ensure_process_group(device_type)
    world = dist.get_world_size()
    if sizes.world_size != world:
        raise MegatronConfigError(
            f"The DeviceMesh covers {sizes.world_size} processes (tp={sizes.tp} x cp={sizes.cp} x dp={sizes.dp} x "
            f"pp={sizes.pp}) but {world} were launched; make the sizes multiply to {world}."
        )
    if parallel_state.model_parallel_is_initialized():
        if _current == sizes:
            return
        raise MegatronConfigError(
            f"megatron-core's parallel state is already initialised with {_current or 'other sizes'} in this "
            f"process; a MegatronModel with {sizes} cannot share it. Use one layout per process, or call "
            "twinkle_megatron.parallel.state.destroy() first."
        )
    parallel_state.initialize_model_parallel(**sizes.initialize_kwargs())
    collective.set_data_group(parallel_state.get_data_parallel_group(with_context_parallel=True))
    _current = sizes


def destroy() -> None:
    """Tear down megatron's parallel state (not torch.distributed)."""
    global _current
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    collective.set_data_group(None)
    _current = None


@dataclass(frozen=True)
class Ranks:
    """This process's coordinates in megatron's groups."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    tp_group: Any
    is_first_stage: bool
    is_last_stage: bool


def ranks() -> Ranks:
    from megatron.core import parallel_state as ps

    return Ranks(
        tp=ps.get_tensor_model_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
        cp=ps.get_context_parallel_rank(), dp=ps.get_data_parallel_rank(), ep=ps.get_expert_model_parallel_rank(),
        tp_group=ps.get_tensor_model_parallel_group(), is_first_stage=ps.is_pipeline_first_stage(),
        is_last_stage=ps.is_pipeline_last_stage(),
    )


def seed(seed_value: int, device_type: str) -> None:
    """Seed torch and megatron's model-parallel RNG streams (the CPU tracker on CPU)."""
    import torch

    torch.manual_seed(seed_value)
    if device_type == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed_value)
    else:
        from twinkle_megatron import cpu_compat

        cpu_compat.reset_rng_tracker()
