"""MultiLoraTransformersModel: many tenants' LoRA adapters trained on one shared transformers model.

``max_loras`` peft adapters (``lora_0`` ...) of rank ``max_r`` are created on ``target_modules``
right after loading, before any wrapping. Tenants borrow them through ``model.multi_lora``
(:class:`twinkle.multi_lora.MultiLora`). Every TwinkleModel method takes ``adapter_name=`` = the
tenant name *or* the slot name ``acquire_lora`` returned (both select the tenant's group; a free
slot's name, another name or a missing name inside no ``adapter()`` block is an error). Each
tenant has its own optimizer group (optimizer, scheduler, loss, metrics, template, processor,
accumulation). Every public method runs under the manager's lock, so threads take turns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, PretrainedConfig

from twinkle.mesh import DeviceMesh
from twinkle.model.inputs import check_row_length, collate
from twinkle.model.lora_targets import with_default_targets
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.multi_lora import LoraTenant, MultiLora, serialize_calls
from twinkle.remote import remote_class
from twinkle.utils.checks import check_int
from twinkle_hf.model.transformers_model import TransformersModel
from twinkle_hf.multi_lora.batched import BatchedMixin
from twinkle_hf.multi_lora.slots import LoraSlots, Route, matches
from twinkle_hf.multi_lora.tenant_io import config_fits, load_tenant, read_tenant_config, save_tenant, tenant_state_dict


class MultiLoraTransformersModel(BatchedMixin, TransformersModel):
    """TransformersModel with ``max_loras`` pre-created LoRA slots of rank ``max_r`` for tenants.

    ``target_modules`` (default ``'all-linear'``) are the layers every slot covers; a tenant may
    target any subset. ``max_length`` bounds the tokens per row of one call.
    """

    _builds_on_meta = False  # the slots snapshot their initial weights at construction
    supports_async_save = False  # a tenant's adapter is a slice of the shared slots, small: written at once

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
                 **kwargs: Any) -> None:
        for option, value in (("max_length", max_length), ("max_loras", max_loras), ("max_r", max_r)):
            check_int(value, option)
        if kwargs.get("memory_efficient_init"):
            raise ValueError("memory_efficient_init=True is not supported by MultiLoraTransformersModel yet "
                                      "(slots snapshot their initial weights at construction); leave it False.")
        super().__init__(model_cls, model_id, config, device_mesh, mixed_precision,
                         grad_scaler_config=grad_scaler_config, **kwargs)
        self.max_length = max_length
        # a tenant leaves the other slots (and its untargeted layers) unused in every forward
        self.ddp_config.setdefault("find_unused_parameters", True)
        self.slot_config = LoraConfig(r=max_r, lora_alpha=max_r, lora_dropout=0.0, target_modules=target_modules)
        self._check_targets(self.slot_config)
        self.slots: LoraSlots | None = None
        self.optimizer_group = {}
        self.multi_lora = MultiLora(self, max_loras, max_r, self.slot_config)
        for param in self.model.parameters():
            param.requires_grad_(False)
        for tenant in self.multi_lora.tenants:  # every slot stays trainable: a fixed set for DDP/FSDP
            for name in self.slots.layers:
                for param in self.slots.pair(name, tenant.adapter_name):
                    param.requires_grad_(True)

    # --------------------------------------------------------- SlotBackend protocol
    def slot_targets(self) -> frozenset[str]:
        return frozenset(self.slots.layers)

    def create_slot(self, tenant: LoraTenant) -> None:
        """Add peft adapter ``tenant.adapter_name`` (rank max_r) and snapshot its initial weights."""
        if self.slots is None:
            self.model = get_peft_model(self.model, tenant.config, adapter_name=tenant.adapter_name)
            self.slots = LoraSlots(LoraSlots.lora_layers(self._hf_model()))
        else:
            self.model.add_adapter(tenant.adapter_name, tenant.config)
        self.slots.snapshot(tenant.adapter_name)

    def complete_tenant_config(self, config: Any) -> Any:
        """No target_modules: peft's defaults for this model type, as get_peft_model would choose."""
        return with_default_targets(config, self._hf_model().config.model_type)

    def check_tenant_config(self, config: Any) -> frozenset[str]:
        LoraSlots.check_config(config, [n for n, _ in self._hf_model().named_modules() if n])
        outside = self._outside_slots(config)
        if outside:
            raise ValueError(f"The tenant's target_modules reach {outside[:3]} ({len(outside)} layers) which hold no "
                             f"slot; the slots cover target_modules={self.slot_config.target_modules!r}.")
        return self.slots.targets_of(config)

    def activate_tenant(self, tenant: LoraTenant) -> None:
        spec = self.slots.spec_for(tenant.adapter_name, tenant.tenant_config)
        self.slots.specs[tenant.adapter_name] = spec
        self.slots.zero_unused_ranks(spec)
        self.optimizer_group[tenant.adapter_name] = self._new_group(tenant.adapter_name, is_adapter=True)

    def reset_slot(self, tenant: LoraTenant) -> None:
        self.slots.reset(tenant.adapter_name)
        self.slots.specs.pop(tenant.adapter_name, None)
        self.optimizer_group.pop(tenant.adapter_name, None)

    # ----------------------------------------------------------- tenant adapters
    def acquire_lora(self, tenant: str, config: LoraConfig, *, seed: int | None = None) -> str:
        """``multi_lora.acquire_lora`` as a model method (so a Ray proxy can call it); returns the slot name.

        ``seed`` re-initialises the tenant's LoRA deterministically (peft's init drawn from ``seed``),
        whatever slot it lands in; without it the tenant starts from the slot's initial weights.
        """
        with self.multi_lora.acquired(tenant, config) as name:
            if seed is not None:
                self.slots.seeded_init(self.slots.specs[name], seed)
        return name

    def release_lora(self, tenant: str) -> None:
        """``multi_lora.release_lora`` as a model method: the slot's weights back to their initial state."""
        self.multi_lora.release_lora(tenant)

    def load_lora(self, tenant: str, directory: str | Path) -> str:
        """Acquire a slot for ``tenant`` with a saved PEFT adapter's config and weights."""
        path = Path(directory).expanduser()
        with self.multi_lora.acquired(tenant, read_tenant_config(path)) as name:
            load_tenant(self.slots, self.slots.specs[name], path)
        return name

    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        raise TypeError("MultiLoraTransformersModel adapters are tenant slots: use "
                        "model.multi_lora.acquire_lora(tenant, LoraConfig(...)) or load_lora(tenant, dir).")

    # ------------------------------------------------------- TransformersModel hooks
    def _group(self, adapter_name: str | None = None) -> OptimizerGroup:
        return self.optimizer_group[self.multi_lora.resolve(adapter_name).adapter_name]

    def _activate(self, group: OptimizerGroup) -> None:
        """Routing replaces peft's active adapter (see ``_forward``)."""

    def _group_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        return self.slots.parameters(self.slots.specs[group.name])

    def _forward(self, group: OptimizerGroup, inputs: Any, task: str, training: bool, kwargs: dict[str, Any]) -> Any:
        batch = collate(inputs, group, self._pad_token_id(group))
        check_row_length(batch, self.max_length)
        with self.slots.route([Route(self.slots.specs[group.name])]):
            return super()._forward(group, batch, task, training, kwargs)

    @contextmanager
    def _reference_mode(self, group: OptimizerGroup) -> Iterator[None]:
        """The reference policy is the shared base: a route with no tenant adds no LoRA."""
        with self.slots.route([]):
            yield

    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        group = self._group(adapter_name)  # the route also serves gradient-checkpointing recomputes
        with self.slots.route([Route(self.slots.specs[group.name])]):
            super().backward(adapter_name=group.name, **kwargs)

    def _backward(self, group: OptimizerGroup, *args: Any) -> None:
        with self.slots.route([Route(self.slots.specs[group.name])]):
            super()._backward(group, *args)

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        group = self._group(adapter_name)
        super().step(adapter_name=group.name, **kwargs)
        self.slots.zero_unused_ranks(self.slots.specs[group.name], after_step=True)  # whatever the optimizer does

    def _outside_slots(self, config: LoraConfig) -> list[str]:
        """Modules ``config`` targets that are not slot layers."""
        if config.target_modules == "all-linear":
            return []
        return sorted(n for n, _ in self._hf_model().named_modules()
                      if n and n not in self.slots.layers and matches(config, n)
                      and not any(n.startswith(s + ".") for s in self.slots.layers))

    def _save_weights(self, group: OptimizerGroup, directory: Path) -> None:
        tenant = self.multi_lora.resolve(group.name)
        save_tenant(self.slots, self.slots.specs[group.name], tenant.tenant_config, directory, self.model_path)
        self._save_preprocessing(group, directory)

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        tenant = self.multi_lora.resolve(group.name)
        saved = read_tenant_config(directory)
        config_fits(saved, tenant.tenant_config, self.slots.targets_of(saved), self.slots.specs[group.name].targets)
        load_tenant(self.slots, self.slots.specs[group.name], directory)

    def _state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """The tenant's r-rank weights under PEFT file keys."""
        return tenant_state_dict(self.slots, self.slots.specs[group.name])

    def __repr__(self) -> str:
        return (f"MultiLoraTransformersModel({type(self._hf_model()).__name__}, slots={self.multi_lora.max_loras}, "
                f"max_r={self.multi_lora.max_r}, tenants={self.multi_lora.names()}, device={self.device})")


MultiLoraTransformersModel = remote_class()(serialize_calls(MultiLoraTransformersModel))
