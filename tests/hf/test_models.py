"""Tiny Qwen2 / Qwen3 / Llama / Mistral built from configs: a LoRA step and a full step on each."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, make_model, tensor_hash
from peft import LoraConfig


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "mistral"])
def test_lora_and_full_step(family: str) -> None:
    batch = make_batch(0)

    full = make_model(family, seed=1, model_cls="AutoModelForCausalLM")
    assert type(full.model).__name__.lower().startswith(family)
    full.set_optimizer("AdamW", lr=1e-2)
    before = tensor_hash(full.get_state_dict())
    losses = []
    for _ in range(3):
        losses.append(full.forward_backward(inputs=batch))
        full.clip_grad_and_step()
    assert tensor_hash(full.get_state_dict()) != before
    assert losses[-1] < losses[0]

    lora = make_model(family, seed=1)
    lora.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=16, target_modules="all-linear"))
    lora.set_optimizer("Muon", lr=0.05, adjust_lr_fn="match_rms_adamw")
    base = {k: v.clone() for k, v in lora.backend.hf_model().state_dict().items() if "lora_" not in k}
    adapter_before = tensor_hash(lora.get_state_dict())
    losses = []
    for _ in range(3):
        losses.append(lora.forward_backward(inputs=batch))
        lora.clip_grad_and_step()
    assert tensor_hash(lora.get_state_dict()) != adapter_before
    assert losses[-1] < losses[0]
    after = lora.backend.hf_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())
