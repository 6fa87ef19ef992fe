"""MultiLoraMegatronModel: many tenants' LoRA adapters trained on one shared megatron-core GPTModel.

``max_loras`` LoRA slots (``lora_0`` ...) of rank ``max_r`` are put on megatron's parallel linear
layers (``target_modules``, default ``'all-linear'``) right after the weights load, before any
Megatron-DDP wrapping. Tenants borrow them through ``model.multi_lora``
(:class:`twinkle.multi_lora.MultiLora`) or the model's own ``acquire_lora`` / ``load_lora``. The
public API is core's :class:`~twinkle.model.multi_tenant.MultiTenantFacade` (the TwinkleModel API,
the tenant calls, ``forward_backward_multi``); this class only composes the parts: the megatron
backend (the same as MegatronModel's) with the slots (:mod:`twinkle_megatron.lora.slots`) as its
adapters part. Every TwinkleModel method takes ``adapter_name=`` = the tenant name *or* the slot
name ``acquire_lora`` returned. On GPU each slot gets its own Megatron-DDP chunk and optimizer.
"""

from __future__ import annotations

from typing import Any

from twinkle.mesh import DeviceMesh
from twinkle.model.multi_tenant import MultiTenantFacade
from twinkle.remote import remote_class
from twinkle.utils.checks import check_int
from twinkle_megatron.lora.inject import check_lora_config, target_suffixes
from twinkle_megatron.lora.slots import MegatronSlots
from twinkle_megatron.model.build import build_backend
from twinkle_megatron.model.megatron_model import MegatronModel, attach_backend


@remote_class()
class MultiLoraMegatronModel(MultiTenantFacade):
    """MegatronModel's API with ``max_loras`` pre-created LoRA slots of rank ``max_r`` for tenants.

    ``target_modules`` (default ``'all-linear'``) are the layers every slot covers (HF names, as for
    ``add_adapter_to_model``); a tenant may target any subset. ``max_length`` bounds the tokens per
    row of one call. Other arguments are MegatronModel's (``seed=`` among the kwargs).
    """

    def __init__(self,  # noqa: D417
                 model_id: str | None = None,
                 config: Any = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 max_loras: int = 5,
                 max_r: int = 32,
                 max_length: int = 8192,
                 target_modules: Any = "all-linear",
                 **kwargs: Any) -> None:
        from peft import LoraConfig

        for option, value in (("max_loras", max_loras), ("max_r", max_r), ("max_length", max_length)):
            check_int(value, option)
        slot_config = LoraConfig(r=max_r, lora_alpha=max_r, lora_dropout=0.0, target_modules=target_modules)
        check_lora_config(slot_config)
        target_suffixes(slot_config)  # unmappable target_modules refused before any weight loads
        backend = build_backend(model_id, config, device_mesh, mixed_precision, kwargs.pop("seed", None), kwargs)
        slots = MegatronSlots(backend)
        backend.adapters = slots
        self.slot_config = slot_config
        self.slots = slots
        attach_backend(self, backend)
        self._attach_tenants(slots, max_loras, max_r, slot_config, max_length)
        backend.freeze_base()  # every slot stays trainable; on GPU each slot gets its own DDP chunk

    def __repr__(self) -> str:
        return (f"MultiLoraMegatronModel({self.backend.args.family.architecture}, slots={self.multi_lora.max_loras}, "
                f"max_r={self.multi_lora.max_r}, tenants={self.multi_lora.names()}, device={self.device})")


# The seed's "MultiLoraMegatronModel inherits MegatronModel": a virtual subclass (isinstance/issubclass hold),
# composed rather than stacked -- both are facades over the same backend.
MegatronModel.register(MultiLoraMegatronModel)
