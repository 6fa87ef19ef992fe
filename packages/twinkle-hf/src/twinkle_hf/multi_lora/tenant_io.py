"""A tenant's adapter as a standard PEFT directory (rank r, not max_r), and back into a slot.

The files (``twinkle_hf.model.weights.write_adapter``) are what ``PeftModel.save_pretrained`` writes for
the tenant's own LoraConfig:
``adapter_model.safetensors`` with keys ``base_model.model.<layer>.lora_A.weight`` (r, in) and
``...lora_B.weight`` (out, r), and ``adapter_config.json``. Loading checks every key and shape
before copying anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from peft import LoraConfig, PeftConfig
from safetensors.torch import load_file

from twinkle.checkpoint import CheckpointError
from twinkle.multi_lora import TenantSpec
from twinkle_hf.model.weights import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from twinkle_hf.multi_lora.sharded import assign, full

if TYPE_CHECKING:
    from twinkle_hf.multi_lora.slots import LoraSlots

_PREFIX = "base_model.model."


def tenant_state_dict(slots: LoraSlots, spec: TenantSpec) -> dict[str, torch.Tensor]:
    """The tenant's r-rank weights under PEFT file keys (copies, on the CPU)."""
    state = {}
    for name in slots.layers:
        if name in spec.targets:
            a, b = slots.pair(name, spec.slot)
            state[f"{_PREFIX}{name}.lora_A.weight"] = full(a)[:spec.r].detach().cpu().clone()
            state[f"{_PREFIX}{name}.lora_B.weight"] = full(b)[:, :spec.r].detach().cpu().clone()
    return state


def read_tenant_config(directory: str | Path) -> LoraConfig:
    """The LoraConfig of a PEFT adapter directory, with a clear error when it is not one."""
    path = Path(directory).expanduser()
    if not (path / ADAPTER_CONFIG).is_file():
        raise CheckpointError(f"{str(path)!r} has no {ADAPTER_CONFIG}; pass a directory written by save() or "
                                "PeftModel.save_pretrained().")
    config = PeftConfig.from_pretrained(str(path))
    if not isinstance(config, LoraConfig):
        raise ValueError(f"{str(path)!r} holds a {type(config).__name__} adapter; multi-LoRA slots take LoRA only.")
    config.inference_mode = False
    return config


def load_tenant(slots: LoraSlots, spec: TenantSpec, directory: Path) -> None:
    """Copy a PEFT directory's r-rank weights into the tenant's slot (unused ranks set to zero)."""
    path = directory / ADAPTER_WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no {ADAPTER_WEIGHTS} (a LoRA adapter written by save()).")
    try:
        state = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file ({exc}).") from exc
    spec.check_fits(state, {k: tuple(v.shape) for k, v in tenant_state_dict(slots, spec).items()}, str(directory))
    with torch.no_grad():
        for name in slots.layers:
            if name in spec.targets:
                a, b = slots.pair(name, spec.slot)
                new_a, new_b = torch.zeros(a.shape, dtype=a.dtype), torch.zeros(b.shape, dtype=b.dtype)
                new_a[:spec.r] = state[f"{_PREFIX}{name}.lora_A.weight"]
                new_b[:, :spec.r] = state[f"{_PREFIX}{name}.lora_B.weight"]
                assign(a, new_a)
                assign(b, new_b)


def config_fits(saved: LoraConfig, tenant: Any, targets_saved: frozenset[str], targets_tenant: frozenset[str]) -> None:
    """A saved adapter loads into an existing tenant only with the same r and layers."""
    if saved.r != tenant.r or targets_saved != targets_tenant:
        raise CheckpointError(f"The saved adapter has r={saved.r} on {len(targets_saved)} layers but the tenant has "
                              f"r={tenant.r} on {len(targets_tenant)} layers; release the tenant and use "
                              "load_lora(tenant, directory) to acquire it with the saved config.")
