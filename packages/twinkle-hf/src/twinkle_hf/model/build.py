"""From TransformersModel's constructor arguments to an :class:`~twinkle_hf.model.backend.HFBackend`.

Everything that can be refused (strategy and mesh, ddp/fsdp configs, the process group, precision,
the GradScaler config) is checked before a weight is read. Then the module is built for its plan:

* FSDP2 with a safetensors checkpoint: on the meta device; each rank reads only its shards when the
  model is sharded (build on meta -> adapters -> shard -> load shards -> optimizer);
* ``memory_efficient_init`` (DDP, or FSDP2 without shard-wise files): rank 0 loads, the others build on meta;
* otherwise every process loads it whole.

Under a sharded plan the module stays on the CPU until ``fully_shard`` places each rank's shards on
its device: no rank ever holds the whole model on the accelerator.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.mesh import DeviceMesh
from twinkle.precision import plan_precision
from twinkle.runtime import get_runtime
from twinkle_hf.distributed import sequence_parallel
from twinkle_hf.distributed.plan import check_configs, check_process_group, make_plan
from twinkle_hf.model.backend import HFBackend
from twinkle_hf.model.loading import build_for_sharding, load_hf_model
from twinkle_hf.model.meta import on_meta


def process_device() -> torch.device:
    """This process's device: the runtime's platform if initialised, else the best available one."""
    from twinkle.platform import detect_platform
    from twinkle.runtime import local_rank

    runtime = get_runtime()
    platform = detect_platform(runtime.platform if runtime.initialized else None)
    return platform.device(local_rank())  # without initialize: torchrun's LOCAL_RANK


def build_backend(model_cls: Any, model_id: str | None, config: Any, device_mesh: DeviceMesh | None,
                  mixed_precision: str, strategy: str, ddp_config: dict[str, Any] | None,
                  fsdp_config: dict[str, Any] | None, grad_scaler_config: dict[str, Any] | None,
                  memory_efficient_init: bool, strict: bool, kwargs: dict[str, Any],
                  meta_ok: bool = True, owner: str | None = None) -> HFBackend:
    """The backend of one transformers model; ``meta_ok=False`` when it needs real weights at once (slots).

    ``owner``: the class that builds it when it runs on dp/fsdp only (the multi-LoRA slots' row-routed
    forward is not written for tensor- or expert-parallel layers), named in the refusal.
    """
    runtime = get_runtime()
    if device_mesh is None and runtime.initialized:
        device_mesh = runtime.device_mesh
    # the cp ranks of a sequence-parallel mesh share the weights like data ranks: the wrapping plan sees them so
    plan = make_plan(strategy, sequence_parallel.wrap_mesh(device_mesh))
    mesh = device_mesh if device_mesh is not None else DeviceMesh.from_sizes(world_size=plan.world_size)
    if owner is not None and (plan.tensor_parallel or plan.expert_parallel):
        raise ValueError(f"{owner} runs on dp and fsdp only: tp_size={plan.tp_size}, ep_size={plan.ep_size} is not "
                         f"built for its LoRA slots. Use DeviceMesh.from_sizes(fsdp_size={plan.world_size}) (FSDP2), "
                         "or TransformersModel with add_adapter_to_model for tensor/expert parallelism.")
    check_configs("native_fsdp" if plan.kind == "fsdp2" else strategy, ddp_config, fsdp_config)
    check_process_group(plan)
    device = process_device()
    precision = plan_precision(mixed_precision, device.type, fp8_provider="torchao.fp8")  # TE wraps no HF layer
    precision.make_grad_scaler(grad_scaler_config)  # validates the config before loading anything
    if (plan.tensor_parallel or plan.expert_parallel) and memory_efficient_init:
        raise ValueError(f"memory_efficient_init=True is not supported with tp_size={plan.tp_size}, ep_size="
                         f"{plan.ep_size} (every tensor- or expert-parallel rank loads the weights and keeps its "
                         "slices); drop memory_efficient_init.")
    rank0_only = memory_efficient_init and plan.distributed
    module = weights_dir = None
    # FSDP2 x TP/EP loads whole, then shards (the meta build's slice reads are not wired to tp/ep yet)
    whole = plan.tensor_parallel or plan.expert_parallel
    if plan.sharded and not whole and meta_ok and model_id is not None and precision.provider is None:
        built = build_for_sharding(model_cls, model_id, config, kwargs, strict=strict)
        if built is not None:
            module, path = built
            weights_dir, rank0_only = path, False  # no rank loads the whole model at all
    if module is None and rank0_only:
        from twinkle_hf.distributed.meminit import load_rank0_only, share_rank0_generator

        module, path = load_rank0_only(model_cls, model_id, config, kwargs)
        share_rank0_generator()  # what is drawn next (adapters' init) is what a plain build draws
    elif module is None:
        module, path = load_hf_model(model_cls, model_id, config, kwargs, strict=strict)
    if precision.provider is not None:
        module = precision.provider.prepare_model(module)
    if not on_meta(module) and (not plan.sharded or plan.tensor_parallel or plan.expert_parallel):  # TP/EP shard there
        module = module.to(device)
    tp_plan = None
    if plan.tensor_parallel:  # resolved before peft wraps any layer (the plan names the plain modules)
        from twinkle_hf.distributed.tensor_parallel import resolve_plan

        tp_plan = resolve_plan(module, plan.tp_size)
    backend = HFBackend(module, model_id=model_id, model_path=path, device=device, precision=precision, plan=plan,
                     mesh=mesh, mixed_precision=mixed_precision, strategy=strategy, ddp_config=dict(ddp_config or {}),
                     fsdp_config=dict(fsdp_config or {}), grad_scaler_config=dict(grad_scaler_config or {}),
                     weights_dir=weights_dir, memory_efficient_pending=rank0_only)
    backend.tp_plan = tp_plan
    if mesh.cp_size > 1:  # before any adapter: the attention modules it tags are the model's own
        backend.sequence_parallel = sequence_parallel.SequenceParallel(module, mesh, device.type)
    if plan.expert_parallel:  # resolved before peft wraps any layer, as the tensor-parallel plan
        from twinkle_hf.distributed.expert_parallel import resolve_plan as resolve_expert_plan

        backend.ep_plan = resolve_expert_plan(module, plan.ep_size)
    return backend
