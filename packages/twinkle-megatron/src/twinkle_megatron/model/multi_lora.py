"""MultiLoraMegatronModel: many tenants' LoRA adapters trained on one shared megatron-core GPTModel.

``max_loras`` LoRA slots (``lora_0`` ...) of rank ``max_r`` are put on megatron's parallel linear
layers (``target_modules``, default ``'all-linear'``) right after the weights load, before any
Megatron-DDP wrapping. Tenants borrow them through ``model.multi_lora``
(:class:`twinkle.multi_lora.MultiLora`); this class is its :class:`~twinkle.multi_lora.SlotBackend`.
Every TwinkleModel method takes ``adapter_name=`` = the tenant name *or* the slot name
``acquire_lora`` returned; a free slot's name, another name, or none outside an ``adapter()`` block
is an error. Each tenant has its own optimizer group. Public methods run under the manager's lock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from twinkle.mesh import DeviceMesh
from twinkle.model.inputs import check_row_length
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.multi_lora import LoraTenant, MultiLora, serialize_calls
from twinkle.remote import remote_class
from twinkle.utils.checks import check_int
from twinkle_megatron.lora.inject import adapter_parameters, check_lora_config, target_suffixes, with_default_targets
from twinkle_megatron.lora.peft_io import read_adapter
from twinkle_megatron.lora.slots import MegatronSlots
from twinkle_megatron.model.groups import _adapter_source
from twinkle_megatron.model.megatron_model import MegatronModel


class MultiLoraMegatronModel(MegatronModel):
    """MegatronModel with ``max_loras`` pre-created LoRA slots of rank ``max_r`` for tenants.

    ``target_modules`` (default ``'all-linear'``) are the layers every slot covers (HF names, as for
    ``add_adapter_to_model``); a tenant may target any subset. ``max_length`` bounds the tokens per
    row of one call. Other arguments are MegatronModel's.
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
        super().__init__(model_id, config, device_mesh, mixed_precision, **kwargs)
        self.max_length = max_length
        self.slot_config = slot_config
        self.slots = MegatronSlots(self.gpt)
        self.optimizer_group: dict[str, OptimizerGroup] = {}
        self.multi_lora = MultiLora(self, max_loras, max_r, slot_config)
        self._freeze_base()  # every slot stays trainable; on GPU each slot gets its own DDP chunk

    # --------------------------------------------------------- SlotBackend protocol
    def slot_targets(self) -> frozenset[str]:
        return frozenset(self.slots.layers())

    def create_slot(self, tenant: LoraTenant) -> None:
        """Add slot ``tenant.adapter_name`` (rank max_r) on every slot layer and snapshot its initial weights."""
        self.slots.create(tenant.adapter_name, tenant.config, seed=tenant.index)

    def complete_tenant_config(self, config: Any) -> Any:
        """No target_modules: peft's defaults for this model type, widened to megatron's fused layers."""
        return with_default_targets(config, self.hf_config.model_type)

    def check_tenant_config(self, config: Any) -> frozenset[str]:
        return self.slots.targets_of(config)[1]

    def activate_tenant(self, tenant: LoraTenant) -> None:
        spec = self.slots.activate(tenant.adapter_name, tenant.tenant_config)
        self.adapters[tenant.adapter_name] = {"config": tenant.tenant_config, "suffixes": spec.suffixes}
        self.optimizer_group[tenant.adapter_name] = OptimizerGroup(tenant.adapter_name, is_adapter=True)

    def reset_slot(self, tenant: LoraTenant) -> None:
        self.slots.reset(tenant.adapter_name)
        self.adapters.pop(tenant.adapter_name, None)
        self.optimizer_group.pop(tenant.adapter_name, None)

    # ----------------------------------------------------------- tenant adapters
    def load_lora(self, tenant: str, directory: str | Path) -> str:
        """Acquire a slot for ``tenant`` with a saved PEFT adapter's config and weights; returns the slot name."""
        path, config, weights = _adapter_source(str(Path(directory).expanduser()))
        with self.multi_lora.acquired(tenant, config) as name:
            self.slots.load(self.slots.specs[name], weights, self.args, self.layout, str(path))
        return name

    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        raise TypeError("MultiLoraMegatronModel adapters are tenant slots: use "
                        "model.multi_lora.acquire_lora(tenant, LoraConfig(...)) or load_lora(tenant, dir).")

    # ------------------------------------------------------------ MegatronModel hooks
    def _group(self, adapter_name: str | None = None) -> OptimizerGroup:
        return self.optimizer_group[self.multi_lora.resolve(adapter_name).adapter_name]

    def _activate(self, group: OptimizerGroup) -> None:
        self.slots.route(self.slots.specs[group.name])

    def _group_named_parameters(self, group: OptimizerGroup) -> list[tuple[str, torch.nn.Parameter]]:
        return self.slots.named_parameters(self.slots.specs[group.name])

    def _ddp_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The whole slot (every slot layer): its DDP chunk outlives the tenant and serves the next one."""
        return [p for _, p in adapter_parameters(self.gpt, group.name)]

    def _prepare(self, group: OptimizerGroup, inputs: Any) -> dict[str, Any]:
        batch = super()._prepare(group, inputs)
        check_row_length(batch, self.max_length)
        return batch

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        group = self._group(adapter_name)
        super().step(adapter_name=group.name, **kwargs)
        self.slots.zero_unused(self.slots.specs[group.name])  # whatever the optimizer (weight decay) does

    def _adapter_tensors(self, adapter: str) -> dict[str, Any]:
        return self.slots.export(self.slots.specs[adapter], self.args, self.layout)

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        tensors, _ = read_adapter(directory)
        self.slots.load(self.slots.specs[group.name], tensors, self.args, self.layout, str(directory))
        driver = group.optimizer
        if driver is not None and hasattr(getattr(driver, "optimizer", None), "reload_model_params"):
            driver.optimizer.reload_model_params()  # fp32 main copies follow the new weights (GPU)

    def __repr__(self) -> str:
        return (f"MultiLoraMegatronModel({self.args.family.architecture}, slots={self.multi_lora.max_loras}, "
                f"max_r={self.multi_lora.max_r}, tenants={self.multi_lora.names()}, device={self.device})")


MultiLoraMegatronModel = remote_class()(
    serialize_calls(MultiLoraMegatronModel, extra=("get_train_configs", "load_lora")))
