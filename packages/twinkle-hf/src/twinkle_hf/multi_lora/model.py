"""MultiLoraTransformersModel: many tenants' LoRA adapters trained on one shared transformers model.

``max_loras`` peft adapters (``lora_0`` ...) of rank ``max_r`` are created on ``target_modules``
right after loading, before any wrapping. Tenants borrow them through ``model.multi_lora``
(:class:`twinkle.multi_lora.MultiLora`) or the model's own ``acquire_lora`` / ``load_lora``. The
public API is core's :class:`~twinkle.model.multi_tenant.MultiTenantFacade` (the TwinkleModel API,
the tenant calls, ``forward_backward_multi``); this class only composes the parts: the HF backend
(the same as TransformersModel's) with the slots (:mod:`twinkle_hf.multi_lora.slots`) as its
adapters part.
"""

from __future__ import annotations

from typing import Any

from peft import LoraConfig
from transformers import AutoModelForCausalLM, PretrainedConfig

from twinkle.checkpoint.manager import CheckpointManager
from twinkle.mesh import DeviceMesh
from twinkle.model.multi_tenant import MultiTenantFacade
from twinkle.remote import remote_class
from twinkle.utils.checks import check_int
from twinkle_hf.model.adapters import check_targets
from twinkle_hf.model.build import build_backend
from twinkle_hf.model.transformers_model import TransformersModel
from twinkle_hf.multi_lora.checkpoint import TenantCheckpointState
from twinkle_hf.multi_lora.slots import LoraSlots


@remote_class()
class MultiLoraTransformersModel(MultiTenantFacade):
    """TransformersModel's API with ``max_loras`` pre-created LoRA slots of rank ``max_r`` for tenants.

    ``target_modules`` (default ``'all-linear'``) are the layers every slot covers; a tenant may
    target any subset. ``max_length`` bounds the tokens per row of one call. The other arguments are
    TransformersModel's.
    """

    supports_async_save = True  # host copies written by a thread of rank 0's, slot-agnostic (multi_lora/checkpoint.py)

    def __init__(self,  # noqa: D417
                 model_cls: Any = AutoModelForCausalLM,
                 model_id: str | None = None,
                 config: PretrainedConfig | None = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 grad_scaler_config: dict[str, Any] | None = None,
                 max_loras: int = 5,
                 max_r: int = 32,
                 max_length: int = 8192,
                 target_modules: Any = "all-linear",
                 strategy: str = "accelerate",
                 ddp_config: dict[str, Any] | None = None,
                 fsdp_config: dict[str, Any] | None = None,
                 memory_efficient_init: bool = False,
                 gradient_checkpointing: bool = False,
                 strict_load: bool = False,
                 **kwargs: Any) -> None:
        for option, value in (("max_length", max_length), ("max_loras", max_loras), ("max_r", max_r)):
            check_int(value, option)
        backend = build_backend(model_cls, model_id, config, device_mesh, mixed_precision, strategy, ddp_config,
                                fsdp_config, grad_scaler_config, memory_efficient_init, strict_load, kwargs,
                                meta_ok=False, owner=type(self).__name__)
        # a tenant leaves the other slots (and its untargeted layers) unused in every forward
        backend.ddp_config.setdefault("find_unused_parameters", True)
        slot_config = LoraConfig(r=max_r, lora_alpha=max_r, lora_dropout=0.0, target_modules=target_modules)
        check_targets(backend.hf_model(), slot_config)
        slots = LoraSlots(backend, slot_config)
        backend.adapters = slots
        self.model_id = model_id
        self.model_path = backend.model_path  # the local directory the weights came from (None: built from config)
        self.mixed_precision = mixed_precision
        self.strategy = strategy
        self.memory_efficient_init = memory_efficient_init
        self.device_mesh = backend.device_mesh
        self.slot_config = slot_config
        self.slots = slots
        checkpoints = CheckpointManager(TenantCheckpointState(backend), type(self).__name__)
        self._attach(backend, checkpoints, {})
        backend.groups = self.optimizer_group
        self._attach_tenants(slots, max_loras, max_r, slot_config, max_length)
        for param in backend.module.parameters():
            param.requires_grad_(False)
        for tenant in self.multi_lora.tenants:  # every slot stays trainable: a fixed set for DDP/FSDP
            for name in slots.layers:
                for param in slots.pair(name, tenant.adapter_name):
                    param.requires_grad_(True)
        if gradient_checkpointing:
            self.apply_patch("GradientCheckpointing")

    def __repr__(self) -> str:
        return (f"MultiLoraTransformersModel({type(self.backend.hf_model()).__name__}, "
                f"slots={self.multi_lora.max_loras}, max_r={self.multi_lora.max_r}, "
                f"tenants={self.multi_lora.names()}, device={self.device})")


# A MultiLoraTransformersModel is a TransformersModel: a virtual subclass (isinstance/issubclass hold),
# composed rather than stacked, as the Megatron pair -- both are facades over one backend.
TransformersModel.register(MultiLoraTransformersModel)
