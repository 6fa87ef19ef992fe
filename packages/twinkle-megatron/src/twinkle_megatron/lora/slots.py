"""Multi-LoRA slots on megatron's LoRA layers: initial weights, tenant specs, rank-masked PEFT export/import.

Every slot is a :class:`LoraParallelLinear` adapter of rank ``max_r`` on the same layers. A tenant
configures its slot (``LoraParallelLinear.configure``): the forward uses ``A[:r]`` and ``B[:, :r]``
with the tenant's scaling and dropout, only on the layers the tenant targets; the other ranks and
layers are kept at zero, so the slot holds exactly an r-rank adapter. Exported tenants are PEFT
tensors of rank r; imported ones are padded back to ``max_r`` with zeros.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle.multi_lora import TenantSpec
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.inject import (
    _targets,
    add_lora,
    check_lora_config,
    hf_target_modules,
    lora_modules,
    target_suffixes,
)
from twinkle_megatron.lora.layer import LoraParallelLinear
from twinkle_megatron.lora.peft_io import export_adapter, import_adapter

#: LoraConfig fields the megatron LoRA layer cannot honour beyond ``check_lora_config``'s, with the allowed value.
_EXTRA_UNSUPPORTED = {"lora_bias": False, "fan_in_fan_out": False}


def _hf_module(key: str) -> str:
    """``...self_attn.q_proj.lora_A.weight`` -> ``q_proj``."""
    return key.split(".")[-3]


class MegatronSlots:
    """The tensor side of the slots on one GPTModel (this rank's stage and TP shard)."""

    def __init__(self, gpt: nn.Module) -> None:
        self.gpt = gpt
        self.initial: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]] = {}
        self.specs: dict[str, TenantSpec] = {}

    def layers(self) -> dict[str, LoraParallelLinear]:
        return lora_modules(self.gpt)

    # -------------------------------------------------------------------- slots
    def create(self, slot: str, config: Any, seed: int) -> None:
        """Add adapter ``slot`` (rank ``config.r``) to every slot layer and snapshot its initial weights."""
        add_lora(self.gpt, slot, config, seed=seed)
        self.initial[slot] = {name: (m.lora_A[slot].detach().clone(), m.lora_B[slot].detach().clone(),
                                     m.r[slot], m.scaling[slot])
                              for name, m in self.layers().items()}
        self.route(None)

    @torch.no_grad()
    def reset(self, slot: str) -> None:
        """Slot weights, rank and scaling back to their initial state; gradients dropped."""
        layers = self.layers()
        for name, (a0, b0, r, scaling) in self.initial[slot].items():
            layer = layers[name]
            layer.lora_A[slot].copy_(a0)
            layer.lora_B[slot].copy_(b0)
            layer.lora_A[slot].grad = layer.lora_B[slot].grad = None
            layer.configure(slot, r, scaling, 0.0)
        self.specs.pop(slot, None)

    # ------------------------------------------------------------------ tenants
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
    def activate(self, slot: str, config: Any) -> TenantSpec:
        """Configure ``slot`` for the tenant's config; unused ranks and untargeted layers set to zero."""
        suffixes, targets = self.targets_of(config)
        spec = TenantSpec.from_config(slot, config, targets, suffixes)
        for name, layer in self.layers().items():
            if name in targets:
                layer.configure(slot, spec.r, spec.scaling, spec.dropout)
        self.specs[slot] = spec
        self.zero_unused(spec)
        return spec

    @torch.no_grad()
    def zero_unused(self, spec: TenantSpec) -> None:
        for name, layer in self.layers().items():
            spec.zero_unused(name, layer.lora_A[spec.slot], layer.lora_B[spec.slot])

    def route(self, spec: TenantSpec | None) -> None:
        """Run ``spec``'s slot on the layers it targets and nothing elsewhere (None: the base model)."""
        for name, layer in self.layers().items():
            layer.set_adapter(spec.slot if spec is not None and name in spec.targets else None)

    def named_parameters(self, spec: TenantSpec) -> list[tuple[str, nn.Parameter]]:
        """What the tenant trains: its slot's A and B on the layers it targets."""
        out = []
        for name, layer in self.layers().items():
            if name in spec.targets:
                out += [(f"{name}.lora_A.{spec.slot}", layer.lora_A[spec.slot]),
                        (f"{name}.lora_B.{spec.slot}", layer.lora_B[spec.slot])]
        return out

    # ---------------------------------------------------------------- PEFT I/O
    def export(self, spec: TenantSpec, args: Any, layout: Any) -> dict[str, torch.Tensor]:
        """The tenant's r-rank tensors under PEFT file keys (full across TP; a collective under TP)."""
        wanted = set(hf_target_modules(spec.suffixes))
        out = {}
        for key, tensor in export_adapter(self.gpt, spec.slot, args, layout).items():
            if _hf_module(key) in wanted:
                out[key] = (tensor[:spec.r] if ".lora_A." in key else tensor[:, :spec.r]).contiguous()
        return out

    def load(self, spec: TenantSpec, tensors: dict[str, torch.Tensor], args: Any, layout: Any, where: str) -> None:
        """Copy a PEFT adapter of the tenant's r and layers into its slot; every key and shape checked first."""
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
