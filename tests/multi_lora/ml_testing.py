"""Helpers for the multi-LoRA tests: models, a plain-peft reference, slot randomisation, hashes."""

from __future__ import annotations

from typing import Any

import torch
from hf_testing import tensor_hash, tiny_config
from peft import LoraConfig
from transformers import AutoModelForCausalLM


def make_multi(seed: int = 0, max_loras: int = 3, max_r: int = 16, mixed_precision: str = "no", **kwargs: Any):
    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(seed)
    return MultiLoraTransformersModel(config=tiny_config(), mixed_precision=mixed_precision, max_loras=max_loras,
                                      max_r=max_r, **kwargs)


def reference_base(model: Any) -> torch.nn.Module:
    """A plain transformers model with the same base weights as the multi-LoRA model."""
    ref = AutoModelForCausalLM.from_config(tiny_config(), dtype=torch.float32)
    state = {k.replace(".base_layer", ""): v for k, v in model.backend.hf_model().state_dict().items()
             if "lora_" not in k}
    ref.load_state_dict(state, strict=True)
    return ref


@torch.no_grad()
def randomize(model: Any, tenant: str, seed: int) -> None:
    """Random r-rank weights for ``tenant`` (non-zero B, so the LoRA changes the output)."""
    gen = torch.Generator().manual_seed(seed)
    spec = model.slots.specs[model.multi_lora.get(tenant).adapter_name]
    for name in spec.targets:
        a, b = model.slots.pair(name, spec.slot)
        a[:spec.r].copy_(torch.randn(a[:spec.r].shape, generator=gen) * 0.2)
        b[:, :spec.r].copy_(torch.randn(b[:, :spec.r].shape, generator=gen) * 0.2)


def tenant_hash(model: Any, tenant: str) -> str:
    """Every tensor of a tenant: slot weights and grads, optimizer, scheduler, progress and metrics."""
    slot = model.multi_lora.get(tenant).adapter_name
    group = model.optimizer_group[slot]
    parts: dict[str, Any] = {}
    for name in model.slots.layers:
        a, b = model.slots.pair(name, slot)
        parts[name] = [a, b, a.grad, b.grad]
    parts["opt"] = group.optimizer.state_dict() if group.optimizer is not None else None
    parts["sched"] = group.lr_scheduler.state_dict() if group.lr_scheduler is not None else None
    parts["progress"] = (group.cur_step, group.micro_step, group.total_micro_steps, group.window_items,
                         group.gradient_accumulation_steps, group.total_train_tokens)
    parts["metrics"] = [dict(vars(m)) for m in group.train_metrics + group.eval_metrics]
    return tensor_hash(parts)


def lora(r: int = 4, alpha: int = 8, targets: Any = ("q_proj", "v_proj"), **kwargs: Any) -> LoraConfig:
    if targets is not None and not isinstance(targets, str):
        targets = list(targets)
    return LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **kwargs)
