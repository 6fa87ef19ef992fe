"""MegatronModel: a megatron-core GPTModel converted from an HF checkpoint, plus its training parts.

Construction order matters and is the point of this file: everything that can be refused (the
architecture, the mesh, VPP, precision, megatron kwargs) is checked before any process group is
created or any weight is read. The class is assembled from mixins like TransformersModel: groups
and LoRA (``groups.py``), components (``components.py``), computing (``training.py``, GPU schedule in
``schedule.py``), updating (``stepping.py``), checkpoints (``checkpoint.py``), summary (``summary.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.mesh import DeviceMesh
from twinkle.model import TwinkleModel
from twinkle.model.optimizer_group import DEFAULT_GROUP, OptimizerGroup
from twinkle.precision import PrecisionPlan, plan_precision
from twinkle.remote import remote_class
from twinkle.runtime import get_runtime
from twinkle_megatron import cpu_compat
from twinkle_megatron.bridge.config import ModelArgs, model_args
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model.checkpoint import CheckpointMixin
from twinkle_megatron.model.components import ComponentsMixin
from twinkle_megatron.model.groups import GroupsMixin
from twinkle_megatron.model.kwargs import MegatronKwargs
from twinkle_megatron.model.loading import load_hf_config, load_weights
from twinkle_megatron.model.stepping import SteppingMixin
from twinkle_megatron.model.summary import SummaryMixin
from twinkle_megatron.model.training import TrainingMixin
from twinkle_megatron.parallel import state
from twinkle_megatron.parallel.mesh import ParallelSizes, check_model_fits, check_runtime_support, parallel_sizes
from twinkle_megatron.te import import_te

MEGATRON_PRECISIONS = ("no", "bf16", "fp16", "fp8")


def _device() -> torch.device:
    from twinkle.platform import detect_platform
    from twinkle.runtime import local_rank

    runtime = get_runtime()
    platform = detect_platform(runtime.platform if runtime.initialized else None)
    return platform.device(local_rank())  # without initialize: torchrun's LOCAL_RANK


def _check_precision(mixed_precision: str, device_type: str) -> PrecisionPlan:
    if mixed_precision not in MEGATRON_PRECISIONS:
        raise MegatronConfigError(f"mixed_precision={mixed_precision!r} is not one of "
                                  f"{', '.join(MEGATRON_PRECISIONS)}.")
    if mixed_precision == "fp8":
        plan_precision("fp8", device_type)  # PrecisionError naming what is missing (TE, a Hopper GPU)
        return PrecisionPlan("fp8", device_type)
    if device_type == "cuda":  # megatron holds bf16/fp16 weights itself (Float16Module + fp32 main params)
        return PrecisionPlan(mixed_precision, device_type)
    return plan_precision(mixed_precision, device_type)  # CPU: fp32 weights under torch.autocast


@remote_class()
class MegatronModel(GroupsMixin, ComponentsMixin, TrainingMixin, SteppingMixin, CheckpointMixin, SummaryMixin,
                    TwinkleModel):
    """megatron-core GPTModel with per-adapter optimizer groups (see ``twinkle.model.base``).

    ``model_id``: hub id (``ms://``, ``hf://``), local HF directory, or a full-model checkpoint
    written by :meth:`save`; ``config``: an HF config (random init when ``model_id`` is None, or
    overriding the directory's config). tp/pp/cp/ep/dp and sequence_parallel come from
    ``device_mesh``; VPP is refused. ``kwargs`` are megatron training arguments, each sent to the
    megatron object it configures (TransformerConfig, DDP config, optimizer defaults, micro_batch_size:
    see ``model/kwargs.py``). ``.gpt`` is this rank's GPTModel; ``.model`` what forward runs
    (wrapped in Megatron DDP on GPU once an optimizer is set).
    """

    def __init__(self,  # noqa: D417
                 model_id: str | None = None,
                 config: Any = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 seed: int | None = None,
                 **kwargs: Any) -> None:
        from twinkle_megatron.build import build_gpt
        from twinkle_megatron.model.kwargs import split_kwargs

        self.device = _device()
        self.device_type = self.device.type
        self.precision = _check_precision(mixed_precision, self.device_type)
        self.mixed_precision = mixed_precision
        self.device_mesh = device_mesh if device_mesh is not None else get_runtime().device_mesh
        self.sizes: ParallelSizes = parallel_sizes(self.device_mesh)  # VPP / fsdp refused here
        self.hf_config, self.model_path = load_hf_config(model_id, config)
        self.args: ModelArgs = model_args(self.hf_config)  # unmapped architectures refused here
        check_model_fits(self.sizes, self.args)
        te, _ = import_te()
        self.use_te = te is not None and self.device_type == "cuda"
        check_runtime_support(self.sizes, self.device_type, self.use_te)
        if self.args.num_experts and not self.use_te:
            raise MegatronConfigError(
                f"{self.args.family.architecture} is a mixture-of-experts model: megatron-core 0.16's MoE layers need "
                "CUDA and Transformer Engine (its router calls TE's GEMM, its token dispatcher a CUDA stream). "
                "Run it on a GPU with transformer-engine[pytorch] installed."
            )
        self.megatron_kwargs: MegatronKwargs = split_kwargs(kwargs)  # unknown names refused here
        self.model_id = model_id
        if self.device_type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            cpu_compat.enable()
        state.initialize(self.sizes, self.device_type)
        state.seed(seed if seed is not None else (get_runtime().seed or 42), self.device_type)
        self.ranks = state.ranks()
        built = build_gpt(self.args, self.sizes, self.ranks, mixed_precision, self.device_type, self.use_te,
                          self.megatron_kwargs.transformer, init_weights=self.model_path is None)
        self.gpt, self.transformer_config, self.layout = built.gpt, built.config, built.layout
        if self.model_path is not None:
            load_weights(self.gpt, self.model_path, self.args, self.layout)
        self.model: torch.nn.Module = self.gpt
        self.chunks: list[Any] | None = None  # Megatron DDP chunks once wrapped (GPU)
        self.optimizer_group: dict[str, OptimizerGroup] = {DEFAULT_GROUP: OptimizerGroup(DEFAULT_GROUP)}
        self.adapters: dict[str, dict[str, Any]] = {}
        self.patches: list[Any] = []

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def __repr__(self) -> str:
        return (f"MegatronModel({self.args.family.architecture}, {self.device_mesh.describe()}, "
                f"groups={list(self.optimizer_group)}, mixed_precision={self.mixed_precision!r}, device={self.device})")

