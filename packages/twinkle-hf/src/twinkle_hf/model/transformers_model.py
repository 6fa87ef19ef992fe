"""TransformersModel: a transformers model plus its training parts, on one process.

The class is assembled from mixins, one per responsibility: groups and adapters
(``groups.py``), components (``components.py``), computing (``training.py``), updating
(``stepping.py``), checkpoints (``checkpoint.py``) and the summary (``summary.py``). This file only
constructs it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from twinkle.mesh import DeviceMesh
from twinkle.model import TwinkleModel
from twinkle.model.optimizer_group import DEFAULT_GROUP, OptimizerGroup
from twinkle.precision import PrecisionPlan, plan_precision
from twinkle.remote import remote_class
from twinkle.runtime import get_runtime
from twinkle_hf.distributed.mixin import DistributedMixin
from twinkle_hf.distributed.plan import check_configs, check_process_group, make_plan
from twinkle_hf.model.checkpoint import CheckpointMixin
from twinkle_hf.model.components import ComponentsMixin
from twinkle_hf.model.groups import GroupsMixin
from twinkle_hf.model.loading import build_for_sharding, load_hf_model
from twinkle_hf.model.meta import on_meta
from twinkle_hf.model.stepping import SteppingMixin
from twinkle_hf.model.summary import SummaryMixin
from twinkle_hf.model.training import TrainingMixin
from twinkle_hf.model.vision import VisionMixin


def _device() -> torch.device:
    """This process's device: the runtime's platform if initialised, else the best available one."""
    from twinkle.platform import detect_platform
    from twinkle.runtime import local_rank

    runtime = get_runtime()
    platform = detect_platform(runtime.platform if runtime.initialized else None)
    return platform.device(local_rank())  # without initialize: torchrun's LOCAL_RANK


@remote_class()
class TransformersModel(VisionMixin, DistributedMixin, GroupsMixin, ComponentsMixin, TrainingMixin, SteppingMixin,
                        CheckpointMixin, SummaryMixin, TwinkleModel):
    """A transformers model with per-adapter optimizer groups (see ``twinkle.model.base``).

    ``model_id`` is a hub id (``ms://``, ``hf://``), a ``twinkle://`` asset, a local directory or a
    full-model checkpoint written by :meth:`save`; ``config`` builds a randomly initialised model.
    ``kwargs`` go to ``from_pretrained`` / ``from_config`` (weights default to float32 so mixed
    precision keeps fp32 master weights). ``mixed_precision``: ``no``, ``bf16`` (autocast, CPU too),
    ``fp16`` (autocast + GradScaler configured by ``grad_scaler_config``) or ``fp8`` (a registered
    precision provider). ``.model`` is the underlying module (a ``PeftModel`` once adapters exist).
    Without adapters the single group is ``'default'`` and trains the whole model.

    Under ``torchrun`` (or Ray) the model is wrapped from ``device_mesh`` and ``strategy``: DDP for a
    data-parallel-only mesh, FSDP2 per decoder layer when ``fsdp_size > 1`` (``native_fsdp``: torch's
    ``fully_shard``, HSDP when ``dp_size > 1`` too — also chosen for ``accelerate`` on such a mesh;
    ``accelerate``: its FSDP2 plugin from ``fsdp_config``). Wrapping happens at the first
    ``set_optimizer`` or forward, after adapters are added. Under FSDP2 a safetensors checkpoint is
    built on the meta device and every rank reads only its own shards when the model is wrapped
    (build on meta -> adapters -> shard -> load shards -> optimizer). ``memory_efficient_init``: for
    DDP and random init, only rank 0 reads (or builds) the weights (see docs/distributed.md).
    ``gradient_checkpointing``: recompute activations in backward (the ``GradientCheckpointing`` patch):
    the same losses with less activation memory. ``strict_load``: weights in ``model_id`` that do not fit
    the model (missing/unexpected/mis-shaped) are an error instead of transformers' warning.
    """

    #: Subclasses that need real weights right after construction (MultiLora snapshots its slots) say False.
    _builds_on_meta = True

    def __init__(self,  # noqa: D417
                 model_cls: Any = AutoModelForCausalLM,
                 model_id: str | None = None,
                 config: PretrainedConfig | None = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 strategy: str = "accelerate",
                 ddp_config: dict[str, Any] | None = None,
                 fsdp_config: dict[str, Any] | None = None,
                 grad_scaler_config: dict[str, Any] | None = None,
                 memory_efficient_init: bool = False,
                 gradient_checkpointing: bool = False,
                 strict_load: bool = False,
                 **kwargs: Any) -> None:
        runtime = get_runtime()
        if device_mesh is None and runtime.initialized:
            device_mesh = runtime.device_mesh
        self.dist_plan = make_plan(strategy, device_mesh)
        self.device_mesh = device_mesh if device_mesh is not None else DeviceMesh.from_sizes(
            world_size=self.dist_plan.world_size)
        check_configs("native_fsdp" if self.dist_plan.kind == "fsdp2" else strategy, ddp_config, fsdp_config)
        check_process_group(self.dist_plan)
        self.device = _device()
        self.precision: PrecisionPlan = plan_precision(mixed_precision, self.device.type)
        self.precision.make_grad_scaler(grad_scaler_config)  # validates the config before loading anything
        self.mixed_precision = mixed_precision
        self.strategy = strategy
        self.ddp_config = dict(ddp_config or {})
        self.fsdp_config = dict(fsdp_config or {})
        self.grad_scaler_config = dict(grad_scaler_config or {})
        self.memory_efficient_init = memory_efficient_init
        self._memory_efficient_pending = memory_efficient_init and self.dist_plan.distributed
        self._weights_dir: str | None = None  # FSDP2: each rank reads its shards from here once sharded
        model = self._build(model_cls, model_id, config, kwargs, strict_load)
        self.model_id = model_id
        if self.precision.provider is not None:
            model = self.precision.provider.prepare_model(model)
        self.model = model if on_meta(model) else model.to(self.device)
        self.optimizer_group: dict[str, OptimizerGroup] = {DEFAULT_GROUP: self._new_group(DEFAULT_GROUP)}
        self.patches: list[Any] = []
        if gradient_checkpointing:
            self.apply_patch("GradientCheckpointing")

    def _build(self, model_cls: Any, model_id: str | None, config: PretrainedConfig | None,
               kwargs: dict[str, Any], strict: bool) -> Any:
        """The transformers model for this plan: under FSDP2 a checkpoint is built on the meta device (each
        rank reads its shards once wrapped); ``memory_efficient_init``: rank 0 loads, the others build on
        meta; otherwise every process loads it whole."""
        if self.dist_plan.sharded and self._builds_on_meta and model_id is not None and self.precision.provider is None:
            built = build_for_sharding(model_cls, model_id, config, kwargs, strict=strict)
            if built is not None:
                model, self.model_path = built
                self._weights_dir = self.model_path
                self._memory_efficient_pending = False  # no rank loads the whole model at all
                return model
        if self._memory_efficient_pending:
            from twinkle_hf.distributed.meminit import load_rank0_only

            model, self.model_path = load_rank0_only(model_cls, model_id, config, kwargs)
            return model
        model, self.model_path = load_hf_model(model_cls, model_id, config, kwargs, strict=strict)
        return model

    def _new_group(self, name: str, is_adapter: bool = False, gradient_accumulation_steps: int = 1) -> OptimizerGroup:
        """A fresh group; under fp16 it gets its own GradScaler from the first backward on."""
        return OptimizerGroup(name, is_adapter=is_adapter, gradient_accumulation_steps=gradient_accumulation_steps,
                              scaler=self.precision.make_grad_scaler(self.grad_scaler_config))

    def __repr__(self) -> str:
        return (f"TransformersModel({type(self._hf_model()).__name__}, groups={list(self.optimizer_group)}, "
                f"mixed_precision={self.mixed_precision!r}, device={self.device})")
