"""Applying a plan to a module: torch DDP, native FSDP2 (per decoder layer, then the root; HSDP on a
2-D mesh) or accelerate's FSDP2 plugin. Sharding is verified: parameters must be DTensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from twinkle.mesh import DeviceMesh
from twinkle_hf.distributed.layers import decoder_layer_classes, modules_of
from twinkle_hf.distributed.plan import DistributedPlan, check_configs, own_fsdp_keys

_MP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TaskRunner(torch.nn.Module):
    """The module DDP wraps: its forward runs one task, so every task goes through DDP's hooks."""

    def __init__(self, model: torch.nn.Module, run: Any) -> None:
        super().__init__()
        self.model = model
        self._run = run

    def forward(self, task: str, batch: dict[str, Any], pooling: str | None) -> Any:
        return self._run(task, batch, pooling)


def wrap_ddp(model: torch.nn.Module, run: Any, device: torch.device, ddp_config: dict[str, Any],
             multi_adapter: bool) -> torch.nn.parallel.DistributedDataParallel:
    """DDP over a TaskRunner; unused parameters are expected when several adapters share the model."""
    from torch.nn.parallel import DistributedDataParallel

    config = dict(ddp_config)
    if multi_adapter:
        config.setdefault("find_unused_parameters", True)
    device_ids = [device.index] if device.type != "cpu" and device.index is not None else None
    # DDP only syncs parameters that require grad when it is built; peft freezes every adapter but the
    # active one, so all adapter parameters are made trainable for the construction.
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad and _is_adapter_param(n)]
    for param in frozen:
        param.requires_grad_(True)
    try:
        return DistributedDataParallel(TaskRunner(model, run), device_ids=device_ids, **config)
    except TypeError as exc:
        raise TypeError(f"ddp_config={ddp_config!r} is not valid for torch DistributedDataParallel: {exc}") from exc
    finally:
        for param in frozen:
            param.requires_grad_(False)


def _is_adapter_param(name: str) -> bool:
    return any(tag in name for tag in (".lora_", ".modules_to_save.", ".lora_embedding_"))


@dataclass(frozen=True)
class TorchMeshes:
    """The torch meshes of one plan, all sliced from one root mesh (FSDP2 over TP needs a common parent)."""

    fsdp: Any  # what fully_shard spans: ('dp', 'fsdp') for HSDP, ('fsdp',) otherwise; None without FSDP2
    tp: Any  # the tensor-parallel dimension, None without TP
    data_group: Any  # the ranks that read different batches (None: the world)
    ep: Any = None  # the expert-parallel dimension, None without EP
    ep_tp: Any = None  # transformers' "ranks sharing one batch" for its EP styles: size 1 (no TP with EP)
    ep_fsdp: Any = None  # the ranks holding the same experts (data ranks / ep): FSDP2 shards the experts there


def torch_meshes(plan: DistributedPlan, mesh: DeviceMesh, device_type: str) -> TorchMeshes:
    """The torch meshes of ``plan``: for FSDP2 alone the ('fsdp',) or HSDP's ('dp', 'fsdp') mesh; with TP the
    dimensions of one ('dp', 'fsdp', 'tp') mesh laid out as twinkle's (tp the fastest)."""
    from torch.distributed.device_mesh import init_device_mesh

    if not plan.tensor_parallel:
        if plan.hsdp:
            fsdp = init_device_mesh(device_type, (plan.dp_size, plan.fsdp_size), mesh_dim_names=("dp", "fsdp"))
        else:
            fsdp = init_device_mesh(device_type, (plan.world_size,), mesh_dim_names=("fsdp",))
        if not plan.expert_parallel:
            return TorchMeshes(fsdp, None, None)
        # the data ranks as (replicas, ep): each run of ep_size adjacent ranks holds all the experts once
        experts = init_device_mesh(device_type, (plan.data_size // plan.ep_size, plan.ep_size, 1),
                                   mesh_dim_names=("ep_replicate", "ep", "ep_tp"))
        return TorchMeshes(fsdp, None, None, experts["ep"], experts["ep_tp"], experts["ep_replicate"])
    root = mesh.to_torch(device_type, dims=("dp", "fsdp", "tp"))
    if plan.dp_size > 1 and plan.fsdp_size > 1:
        data = root["dp", "fsdp"]._flatten("data").get_group()  # torch has no public flatten yet (torchtitan's way)
    else:
        data = root["dp" if plan.dp_size > 1 else "fsdp"].get_group()
    fsdp = None
    if plan.sharded:
        fsdp = root["dp", "fsdp"] if plan.hsdp else root["fsdp"]
    return TorchMeshes(fsdp, root["tp"], data)


def mp_policy(mixed_precision: str, fsdp_config: dict[str, Any]) -> Any:
    """FSDP2's MixedPrecisionPolicy: parameters cast to bf16/fp16 for compute, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = _MP_DTYPES.get(mixed_precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=fsdp_config.get("reduce_dtype", torch.float32))


def wrap_fsdp2(model: torch.nn.Module, hf_model: torch.nn.Module, fsdp_mesh: Any, mixed_precision: str,
               fsdp_config: dict[str, Any], experts: list[torch.nn.Module] = (),
               experts_mesh: Any = None) -> list[str]:
    """``fully_shard`` each decoder layer, then the root (in place), over ``fsdp_mesh``; returns the layer
    classes used.

    Expert-parallel ``experts`` modules are sharded first, each its own unit over ``experts_mesh`` (the
    ranks holding the same experts); their gradients are averaged over those ranks only, and
    ``expert_parallel.finish_expert_grads`` divides them by ``ep_size`` too (torchtitan sets the divide
    factor to the data size instead, a PREMUL_SUM reduce-scatter that gloo does not run).
    """
    from torch.distributed.fsdp import fully_shard

    check_configs("native_fsdp", None, fsdp_config)
    classes = decoder_layer_classes(model, hf_model)
    kwargs = {"mesh": fsdp_mesh, "mp_policy": mp_policy(mixed_precision, fsdp_config),
              "reshard_after_forward": fsdp_config.get("reshard_after_forward", True)}
    for module in experts:
        fully_shard(module, **{**kwargs, "mesh": experts_mesh})
    for layer in modules_of(model, classes):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    check_sharded(model, "native_fsdp")
    return classes


def wrap_accelerate_fsdp2(model: torch.nn.Module, hf_model: torch.nn.Module, device: torch.device,
                          mixed_precision: str, fsdp_config: dict[str, Any]) -> tuple[Any, list[str]]:
    """accelerate's FSDP2 plugin from ``fsdp_config``; returns (accelerator, layer classes).

    ``mixed_precision='bf16'|'fp16'`` becomes the plugin's policy the way accelerate sets it itself
    (parameters all-gathered and, for bf16, gradients reduce-scattered in that dtype) unless
    ``fsdp_config`` names a ``mixed_precision_policy``. fp16 gradients are reduced in fp32, as under
    native FSDP2: loss-scaled fp16 gradients summed over ranks overflow fp16's range. accelerate
    ignores an FSDP plugin when it runs on CPU and wraps in DDP instead; the distributed type is set
    to FSDP explicitly so it really shards, and the result is checked. accelerate's process-wide
    state is put back as it was afterwards.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    classes = decoder_layer_classes(model, hf_model)
    hf_model._no_split_modules = classes
    config = {"fsdp_version": 2, "auto_wrap_policy": "transformer_based_wrap",
              "transformer_cls_names_to_wrap": classes, "reshard_after_forward": True, **own_fsdp_keys(fsdp_config)}
    if any(p.is_meta for p in model.parameters()):  # twinkle reads each rank's shards itself after wrapping
        config["cpu_ram_efficient_loading"] = False
    with accelerate_state_restored():
        try:
            plugin = FullyShardedDataParallelPlugin(**config)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"fsdp_config={fsdp_config!r} is not valid for accelerate's "
                             f"FullyShardedDataParallelPlugin: {exc}") from exc
        if getattr(plugin, "fsdp_version", 2) != 2:
            raise ValueError("TransformersModel uses FSDP2: fsdp_config['fsdp_version'] must be 2.")
        if plugin.mixed_precision_policy is None and mixed_precision in _MP_DTYPES:
            plugin.set_mixed_precision(mixed_precision)
            if mixed_precision == "fp16":
                plugin.mixed_precision_policy = dataclasses.replace(plugin.mixed_precision_policy,
                                                                    reduce_dtype=torch.float32)
        accelerator = Accelerator(fsdp_plugin=plugin, cpu=device.type == "cpu")
        if accelerator.state.distributed_type != DistributedType.FSDP:
            accelerator.state.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
        fsdp2_prepare_model(accelerator, model)
    check_sharded(model, "accelerate")
    return accelerator, classes


@contextmanager
def accelerate_state_restored() -> Iterator[None]:
    """accelerate keeps process-wide state (shared-state singletons, environment variables, torch's thread
    count); whatever building an Accelerator changes is put back, so a user's own Accelerator is unaffected."""
    import os

    from accelerate.state import AcceleratorState, GradientState, PartialState

    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    environ, threads = dict(os.environ), torch.get_num_threads()
    try:
        yield
    finally:
        for cls, state in saved:
            cls._shared_state.clear()
            cls._shared_state.update(state)
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
        torch.set_num_threads(threads)


def check_sharded(model: torch.nn.Module, strategy: str) -> None:
    """Fail loudly unless every parameter is a DTensor (never a silent fallback to replication)."""
    from torch.distributed.tensor import DTensor

    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:
        raise RuntimeError(f"strategy={strategy!r} left {len(plain)} parameters unsharded (e.g. {plain[:3]}); "
                           "FSDP2 did not apply. Check the accelerate/torch versions, or use "
                           "strategy='native_fsdp'.")


def parallelize(backend: Any) -> None:
    """Wrap ``backend.module`` for its plan, once, in torchtitan's order, read top to bottom.

    Called by ``set_optimizer`` (or ``model.parallelize()``) after every adapter exists: peft must
    inject LoRA layers before TP/DDP/FSDP2 see the parameters. The steps:

    1. tensor parallelism (transformers' plan on the ``tp`` mesh; adapters sharded the peft way);
    2. expert parallelism (transformers' ``ep_plan`` on the ``ep`` mesh: whole experts per rank, tokens
       exchanged all-to-all; ``expert_parallel.py``);
    3. activation checkpointing: already in place -- the ``GradientCheckpointing`` patch, applied at
       construction, wraps each decoder layer's call, so it recomputes inside TP's hooks and under FSDP's;
    4. compile: not applied to transformers models by this backend;
    5. data parallelism: DDP, or ``fully_shard`` per decoder layer then the root (HSDP on a 2-D mesh;
       over TP-sharded weights, the fsdp dimension of the same mesh; the experts over the ranks that
       hold the same ones), or accelerate's FSDP2 plugin;
    6. the weights: built on meta (FSDP2 sharded loading), each rank gets storage for its shards only and
       reads its slices from the checkpoint files; ``memory_efficient_init``: rank 0's full weights reach
       the other ranks once wrapped.

    A VL model under FSDP2 gets its vision lockstep (``vision_lockstep.py``); under DDP, a trained vision
    tower makes DDP look for unused parameters (text-only micro-batches leave it without a gradient).
    """
    from twinkle import collective
    from twinkle.log import get_logger
    from twinkle_hf.model.vision import is_multimodal, needs_unused_search
    from twinkle_hf.model.vision_lockstep import VisionLockstep

    plan = backend.dist_plan
    if not plan.distributed:
        return
    hf = backend.hf_model()
    full_state = kept = None
    if backend.memory_efficient_pending:
        from twinkle_hf.distributed import meminit

        full_state = meminit.before_wrap(backend)
    if backend.weights_dir is not None:  # built on meta: adapters and buffers are the only real values yet
        from twinkle_hf.distributed import shard_load

        kept = shard_load.real_tensors(backend.module)
    meshes = torch_meshes(plan, backend.device_mesh, backend.device.type) if plan.kind in ("fsdp2", "tp") else None
    # losses, token counts and metrics are summed over the ranks reading different batches: with TP the
    # dp x fsdp ranks only (a tensor-parallel group shares its batch), otherwise the world
    collective.set_data_group(meshes.data_group if meshes is not None else None)
    # 1. tensor parallelism
    if plan.tensor_parallel:
        _tensor_parallel(backend, hf, meshes)
    # 2. expert parallelism
    if plan.expert_parallel:
        _expert_parallel(backend, hf, meshes)
    # 3. activation checkpointing and 4. compile: see the docstring
    # 5. data parallelism
    if plan.kind == "ddp":
        if needs_unused_search(hf):
            backend.ddp_config.setdefault("find_unused_parameters", True)
        module = backend.module
        adapters = len(getattr(module, "peft_config", {}) or {}) if hasattr(module, "peft_config") else 0
        backend.ddp = wrap_ddp(module, backend.run_unwrapped, backend.device, backend.ddp_config,
                               multi_adapter=adapters > 1)
    elif plan.kind == "fsdp2":
        backend.layer_classes = wrap_fsdp2(backend.module, hf, meshes.fsdp, backend.mixed_precision,
                                           backend.fsdp_config, experts=backend.ep_modules,
                                           experts_mesh=meshes.ep_fsdp)
    elif plan.kind == "accelerate_fsdp2":
        backend.accelerator, backend.layer_classes = wrap_accelerate_fsdp2(
            backend.module, hf, backend.device, backend.mixed_precision, backend.fsdp_config)
    # 6. the weights
    if kept is not None:  # storage for this rank's shards only, then its slices from the files
        shard_load.materialize(backend.module, backend.device, kept)
        shard_load.fill_from_checkpoint(backend.module, backend.weights_dir, skip=set(kept))
        backend.weights_dir = None
    if backend.memory_efficient_pending:
        meminit.after_wrap(backend, full_state)
        backend.memory_efficient_pending = False
    if plan.sharded and is_multimodal(hf.config):
        backend.vision = VisionLockstep(backend)
    get_logger("twinkle_hf").info("wrapped for %s (world %d, tp %d, ep %d, layers %s)", plan.kind,
                                  plan.world_size, plan.tp_size, plan.ep_size, backend.layer_classes)


def _expert_parallel(backend: Any, hf: torch.nn.Module, meshes: TorchMeshes) -> None:
    """transformers' experts plan on the ``ep`` mesh (see ``expert_parallel.py``)."""
    from twinkle_hf.distributed import expert_parallel

    backend.ep_modules = expert_parallel.apply(hf, backend.ep_plan, meshes.ep, meshes.ep_tp)


def _tensor_parallel(backend: Any, hf: torch.nn.Module, meshes: TorchMeshes) -> None:
    """transformers' plan on the ``tp`` mesh (see ``tensor_parallel.py``)."""
    from twinkle_hf.distributed import tensor_parallel

    backend.tp_partial = tensor_parallel.apply(backend.module, hf, backend.tp_plan, meshes.tp)
    backend.tp_group = meshes.tp.get_group()
    backend.layer_classes = []
