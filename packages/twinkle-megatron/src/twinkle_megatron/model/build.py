"""From MegatronModel's constructor arguments to a :class:`~twinkle_megatron.model.backend.MegatronBackend`.

Construction order matters and is the point of this file: everything that can be refused (the
architecture, the mesh, VPP, precision, megatron kwargs) is checked before any process group is
created or any weight is read. Then megatron's parallel state is set up, this rank's GPTModel is
built (its pipeline stage, its TP shard; ``twinkle_megatron.build``) and its weights are read.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.mesh import DeviceMesh
from twinkle.precision import PrecisionPlan, plan_precision
from twinkle.runtime import get_runtime
from twinkle_megatron import cpu_compat
from twinkle_megatron.bridge.config import model_args
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model.backend import MegatronBackend
from twinkle_megatron.model.kwargs import split_kwargs
from twinkle_megatron.model.loading import load_hf_config, load_weights
from twinkle_megatron.parallel import state
from twinkle_megatron.parallel.mesh import check_model_fits, check_runtime_support, parallel_sizes
from twinkle_megatron.te import import_te

MEGATRON_PRECISIONS = ("no", "bf16", "fp16", "fp8")


def process_device() -> torch.device:
    """This process's device: the runtime's platform if initialised, else the best available one."""
    from twinkle.platform import detect_platform
    from twinkle.runtime import local_rank

    runtime = get_runtime()
    platform = detect_platform(runtime.platform if runtime.initialized else None)
    return platform.device(local_rank())  # without initialize: torchrun's LOCAL_RANK


def check_precision(mixed_precision: str, device_type: str) -> PrecisionPlan:
    if mixed_precision not in MEGATRON_PRECISIONS:
        raise MegatronConfigError(f"mixed_precision={mixed_precision!r} is not one of "
                                  f"{', '.join(MEGATRON_PRECISIONS)}.")
    if mixed_precision == "fp8":
        plan_precision("fp8", device_type)  # PrecisionError naming what is missing (TE, a Hopper GPU)
        return PrecisionPlan("fp8", device_type)
    if device_type == "cuda":  # megatron holds bf16/fp16 weights itself (Float16Module + fp32 main params)
        return PrecisionPlan(mixed_precision, device_type)
    return plan_precision(mixed_precision, device_type)  # CPU: fp32 weights under torch.autocast


def build_backend(model_id: str | None, config: Any, device_mesh: DeviceMesh | None, mixed_precision: str,
                  seed: int | None, kwargs: dict[str, Any]) -> MegatronBackend:
    """This rank's GPTModel with its weights, and everything the backend needs to train it."""
    from twinkle_megatron.build import build_gpt

    device = process_device()
    precision = check_precision(mixed_precision, device.type)
    mesh = device_mesh if device_mesh is not None else get_runtime().device_mesh
    sizes = parallel_sizes(mesh)  # VPP / fsdp refused here
    hf_config, model_path = load_hf_config(model_id, config)
    args = model_args(hf_config)  # unmapped architectures refused here
    check_model_fits(sizes, args)
    te, _ = import_te()
    use_te = te is not None and device.type == "cuda"
    check_runtime_support(sizes, device.type, use_te)
    if args.num_experts and not use_te:
        raise MegatronConfigError(
            f"{args.family.architecture} is a mixture-of-experts model: megatron-core 0.16's MoE layers need "
            "CUDA and Transformer Engine (its router calls TE's GEMM, its token dispatcher a CUDA stream). "
            "Run it on a GPU with transformer-engine[pytorch] installed."
        )
    megatron_kwargs = split_kwargs(kwargs)  # unknown names refused here
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        cpu_compat.enable()
    state.initialize(sizes, device.type)
    state.seed(seed if seed is not None else (get_runtime().seed or 42), device.type)
    ranks = state.ranks()
    built = build_gpt(args, sizes, ranks, mixed_precision, device.type, use_te, megatron_kwargs.transformer,
                      init_weights=model_path is None)
    if model_path is not None:
        load_weights(built.gpt, model_path, args, built.layout)
    return MegatronBackend(built.gpt, model_id=model_id, model_path=model_path, hf_config=hf_config, args=args,
                           transformer_config=built.config, layout=built.layout, sizes=sizes, ranks=ranks,
                           device=device, precision=precision, mixed_precision=mixed_precision, device_mesh=mesh,
                           use_te=use_te, megatron_kwargs=megatron_kwargs)
