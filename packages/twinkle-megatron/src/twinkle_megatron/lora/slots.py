"""Multi-LoRA slots on megatron's LoRA layers: initial weights, tenant specs, routing, rank-masked PEFT export/import.

Every slot is a :class:`LoraParallelLinear` adapter of rank ``max_r`` on the same layers. A tenant
configures its slot (``LoraParallelLinear.configure``): the forward uses ``A[:r]`` and ``B[:, :r]``
with the tenant's scaling and dropout, only on the layers the tenant targets; the other ranks and
layers are set to zero when the tenant arrives, so the slot holds exactly an r-rank adapter (and
keeps holding one: those entries get zero gradients, which megatron's Adam/SGD turn into no change,
weight decay of a zero included). Exported tenants are PEFT tensors of rank r; imported ones are
padded back to ``max_r`` with zeros.

:class:`MegatronSlots` has three roles, as the HF slots do: the tensor side of the slots; the
:class:`twinkle.multi_lora.SlotBackend` of the tenant router; and the backend's adapters part (which
slot a forward runs -- one tenant for the whole batch, or a range of rows each -- the parameters a
tenant trains, its adapter files).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from twinkle.engine import Route
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.multi_lora import LoraTenant, TenantSpec
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.inject import (
    _targets,
    adapter_parameters,
    add_lora,
    check_lora_config,
    hf_target_modules,
    lora_modules,
    target_suffixes,
    with_default_targets,
)
from twinkle_megatron.lora.layer import LoraParallelLinear, base_only
from twinkle_megatron.lora.peft_io import (
    adapter_source,
    drop_base_copies,
    export_adapter,
    import_adapter,
    read_adapter,
)

#: LoraConfig fields the megatron LoRA layer cannot honour beyond ``check_lora_config``'s, with the allowed value.
_EXTRA_UNSUPPORTED = {"lora_bias": False, "fan_in_fan_out": False}


def _hf_module(key: str) -> str:
    """``...self_attn.q_proj.lora_A.weight`` -> ``q_proj``."""
    return key.split(".")[-3]


class MegatronSlots:
    """The slots of one GPTModel (this rank's stage and TP shard); see the module docstring."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.gpt = backend.gpt
        self._layers: dict[str, LoraParallelLinear] = {}
        self.initial: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]] = {}
        self.specs: dict[str, TenantSpec] = {}
        self.configs: dict[str, Any] = {}  # the LoraConfig each slot's tenant acquired it with

    def layers(self) -> dict[str, LoraParallelLinear]:
        return self._layers

    # ------------------------------------------------------------ SlotBackend
    def slot_targets(self) -> frozenset[str]:
        return frozenset(self._layers)

    def create_slot(self, tenant: LoraTenant) -> None:
        """Add slot ``tenant.adapter_name`` (rank max_r) on every slot layer and snapshot its initial weights."""
        slot = tenant.adapter_name
        add_lora(self.gpt, slot, tenant.config, seed=tenant.index, vocab_size=self.backend.args.vocab_size)
        self._layers = lora_modules(self.gpt)
        self.initial[slot] = {name: (m.lora_A[slot].detach().clone(), m.lora_B[slot].detach().clone(),
                                     m.r[slot], m.scaling[slot])
                              for name, m in self._layers.items()}
        self.route(None)

    def complete_tenant_config(self, config: Any) -> Any:
        """No target_modules: peft's defaults for this model type, widened to megatron's fused layers."""
        return with_default_targets(config, self.backend.hf_config.model_type)

    def check_tenant_config(self, config: Any) -> frozenset[str]:
        return self.targets_of(config)[1]

    @torch.no_grad()
    def activate_tenant(self, tenant: LoraTenant) -> None:
        """Configure the slot for the tenant's config; unused ranks and untargeted layers set to zero."""
        slot, config = tenant.adapter_name, tenant.tenant_config
        suffixes, targets = self.targets_of(config)
        spec = TenantSpec.from_config(slot, config, targets, suffixes)
        for name, layer in self._layers.items():
            if name in targets:
                layer.configure(slot, spec.r, spec.scaling, spec.dropout)
        self.specs[slot] = spec
        self.configs[slot] = config
        self.zero_unused(spec)
        self.backend.active_group = None

    @torch.no_grad()
    def reset_slot(self, tenant: LoraTenant) -> None:
        """Slot weights, rank and scaling back to their initial state; gradients dropped."""
        slot = tenant.adapter_name
        for name, (a0, b0, r, scaling) in self.initial[slot].items():
            layer = self._layers[name]
            layer.lora_A[slot].copy_(a0)
            layer.lora_B[slot].copy_(b0)
            layer.lora_A[slot].grad = layer.lora_B[slot].grad = None
            layer.configure(slot, r, scaling, 0.0)
        self.specs.pop(slot, None)
        self.configs.pop(slot, None)
        self.backend.active_group = None

    @torch.no_grad()
    def seed_slot(self, slot: str, seed: int) -> None:
        """Re-initialise the tenant's LoRA from ``seed`` as a MegatronModel adapter of its config is initialised.

        Layer by layer in name order, A[:r] is drawn whole (peft's kaiming-uniform) from one generator seeded
        with ``seed`` and sliced for this TP rank, B is zero: the init depends on the seed and the tenant's
        config only, not on which slot it got or on max_r.
        """
        spec = self.specs[slot]
        generator = torch.Generator().manual_seed(int(seed))
        for name in sorted(spec.targets):
            layer = self._layers[name]
            a, b = layer.lora_A[slot], layer.lora_B[slot]
            a.zero_()
            a[:spec.r].copy_(layer.draw_a(spec.r, generator))
            b.zero_()

    def read_tenant_config(self, directory: Path) -> Any:
        return adapter_source(directory)[1]

    def load_slot(self, slot: str, directory: Path) -> None:
        self._import(self.specs[slot], read_adapter(directory)[0], str(directory))

    # ------------------------------------------------------- adapters part
    def activate(self, group: OptimizerGroup) -> None:
        """The whole batch through the group's slot."""
        self.route(self.specs[group.name])

    def route(self, spec: TenantSpec | None) -> None:
        """Run ``spec``'s slot on the layers it targets and nothing elsewhere (None: the base model)."""
        for name, layer in self._layers.items():
            layer.set_adapter(spec.slot if spec is not None and name in spec.targets else None)

    def reference(self) -> Any:
        """The shared base model (every tenant's reference policy), inside the block."""
        return base_only(self._layers.values())

    def route_rows(self, routes: Sequence[Route] | None) -> None:
        """Each route's rows through its tenant's slot (None: back to one adapter per forward)."""
        specs = None if routes is None else [(self.specs[r.group.name], r.rows.start, r.rows.stop) for r in routes]
        for name, layer in self._layers.items():
            layer.route_rows(None if specs is None else [(spec.slot if name in spec.targets else None, start, stop)
                                                         for spec, start, stop in specs])

    def named_parameters(self, group: OptimizerGroup) -> list[tuple[str, nn.Parameter]]:
        """What the tenant trains: its slot's A and B on the layers it targets."""
        spec = self.specs[group.name]
        out = []
        for name, layer in self._layers.items():
            if name in spec.targets:
                out += [(f"{name}.lora_A.{spec.slot}", layer.lora_A[spec.slot]),
                        (f"{name}.lora_B.{spec.slot}", layer.lora_B[spec.slot])]
        return out

    def ddp_parameters(self, group: OptimizerGroup) -> list[nn.Parameter]:
        """The whole slot (every slot layer): its DDP chunk outlives the tenant and serves the next one."""
        return [p for _, p in adapter_parameters(self.gpt, group.name)]

    def add(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        raise TypeError("MultiLoraMegatronModel adapters are tenant slots: use "
                        "model.acquire_lora(tenant, LoraConfig(...)) or load_lora(tenant, dir).")

    def describe(self, group: OptimizerGroup) -> list[str]:
        spec = self.specs[group.name]
        return [f"    lora: r={spec.r} scaling={spec.scaling:g} megatron layers={spec.suffixes} (slot {spec.slot})"]

    def state_dict(self, group: OptimizerGroup) -> dict[str, torch.Tensor]:
        """The tenant's r-rank tensors under PEFT file keys (full across TP; a collective under TP)."""
        spec = self.specs[group.name]
        wanted = set(hf_target_modules(spec.suffixes))
        out = {}
        for key, tensor in export_adapter(self.gpt, spec.slot, self.backend.args, self.backend.layout).items():
            if _hf_module(key) in wanted:
                out[key] = (tensor[:spec.r] if ".lora_A." in key else tensor[:, :spec.r]).contiguous()
        return out

    def peft_config(self, group: OptimizerGroup) -> tuple[Any, list[str]]:
        return self.configs[group.name], self.specs[group.name].suffixes

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        self._import(self.specs[group.name], read_adapter(directory)[0], str(directory))

    # ----------------------------------------------------------------- internals
    def targets_of(self, config: Any) -> tuple[list[str], frozenset[str]]:
        """Validate a tenant LoraConfig (no side effects); its megatron suffixes and the module names it targets."""
        check_lora_config(config)
        for field_name, allowed in _EXTRA_UNSUPPORTED.items():
            if getattr(config, field_name, allowed) != allowed:
                raise MegatronConfigError(f"LoraConfig({field_name}={getattr(config, field_name)!r}) is not "
                                          f"supported by multi-LoRA slots; leave it at {allowed!r}.")
        suffixes = target_suffixes(config)
        return suffixes, frozenset(_targets(self.gpt, suffixes))

    @torch.no_grad()
    def zero_unused(self, spec: TenantSpec) -> None:
        for name, layer in self._layers.items():
            spec.zero_unused(name, layer.lora_A[spec.slot], layer.lora_B[spec.slot])

    def _import(self, spec: TenantSpec, tensors: dict[str, torch.Tensor], where: str) -> None:
        """Copy a PEFT adapter of the tenant's r and layers into its slot; every key and shape checked first."""
        args, layout = self.backend.args, self.backend.layout
        tensors = drop_base_copies(self.gpt, tensors, args, layout, where)
        current = export_adapter(self.gpt, spec.slot, args, layout)
        wanted = set(hf_target_modules(spec.suffixes))
        expected = {k: tuple((v[:spec.r] if ".lora_A." in k else v[:, :spec.r]).shape)
                    for k, v in current.items() if _hf_module(k) in wanted}
        spec.check_fits(tensors, expected, where)
        padded = {}
        for key, tensor in current.items():
            full = torch.zeros_like(tensor)
            if key in expected:
                piece = tensors[key].to(full.dtype)
                if ".lora_A." in key:
                    full[:spec.r] = piece
                else:
                    full[:, :spec.r] = piece
            padded[key] = full
        import_adapter(self.gpt, spec.slot, padded, args, layout, where)
