"""Seed 001's multi-LoRA example exactly as written: no target_modules, ``model.forward(inputs)`` positionally."""

from __future__ import annotations

import torch
from hf_testing import make_batch
from ml_testing import make_multi, randomize, reference_base
from peft import LoraConfig, get_peft_model
from rounding import LORA_TERMS, tiny_hf, within


def test_acquire_without_targets_uses_pefts_defaults_and_forward_takes_inputs_positionally():
    model = make_multi(seed=0, max_loras=2, max_r=16)
    adapter_name = model.multi_lora.acquire_lora("tenant_a", LoraConfig(r=16, lora_alpha=32))
    spec = model.slots.specs[adapter_name]
    assert spec.targets and {name.rsplit(".", 1)[1] for name in spec.targets} == {"q_proj", "v_proj"}
    randomize(model, "tenant_a", seed=1)
    inputs = make_batch(0)
    with model.multi_lora.adapter("tenant_a") as name:
        output = model.forward(inputs)
    assert name == adapter_name

    # the reference: plain peft given the same config, which fills in the same defaults itself
    reference = get_peft_model(reference_base(model), LoraConfig(r=16, lora_alpha=32))
    with torch.no_grad():
        for layer in spec.targets:
            a, b = model.slots.pair(layer, adapter_name)
            module = reference.get_submodule(f"base_model.model.{layer}")
            module.lora_A["default"].weight.copy_(a[:16])
            module.lora_B["default"].weight.copy_(b[:, :16])
        want = reference.eval()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    real = inputs["attention_mask"].bool()
    # another summation order of the same sums: float32's forward bound, 4 rows of 12 tokens (tests/rounding.py)
    bound = tiny_hf(12, 4, extra=LORA_TERMS).forward_bound()
    torch.testing.assert_close(output.logits[real], want[real], **within(bound, want[real]))
    with model.multi_lora.adapter("tenant_a"):
        keyword = model.forward_only(inputs=inputs).logits
        positional = model.forward_only(inputs).logits
    torch.testing.assert_close(positional, keyword, rtol=0, atol=0)  # exact: one forward, the same kernels
