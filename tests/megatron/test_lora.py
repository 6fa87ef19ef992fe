"""LoRA on megatron's parallel linear layers against peft's LoRA on the HF model.

The reference is peft itself: the adapter MegatronModel saves must load with
``PeftModel.from_pretrained`` on the HF model and give the same logits (fp32: the same sums in another order,
within a forward's bound for 4 rows of 12 tokens, tests/rounding.py).
"""

from __future__ import annotations

import pytest
import torch
from megatron_testing import hf_model, make_batch, megatron_model, save_hf, shared_a_adapter
from peft import LoraConfig, PeftModel, get_peft_model
from rounding import LORA_TERMS, tiny_hf, within

from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.layer import LoraParallelLinear

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FWD = tiny_hf(12, 4, vocab=125, extra=LORA_TERMS).forward_bound()


def _randomise_adapter(model, adapter, seed):
    """peft starts B at zero (a no-op adapter); give every LoRA tensor values so the comparison means something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.gpt.modules():
            if isinstance(module, LoraParallelLinear) and adapter in module.lora_B:
                module.lora_B[adapter].copy_(0.1 * torch.randn(module.lora_B[adapter].shape, generator=gen))


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_saved_adapter_loads_in_peft_with_the_same_logits(tmp_path):
    base = save_hf(hf_model("qwen2"), tmp_path / "hf")
    model = megatron_model(base)
    model.add_adapter_to_model("tenant", LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    _randomise_adapter(model, "tenant", seed=1)
    path = model.save("adapter", output_dir=str(tmp_path))

    peft_model = PeftModel.from_pretrained(hf_model("qwen2"), path).eval()
    batch = make_batch(seed=3)
    ours = model.forward_only(inputs=batch, adapter_name="tenant")["logits"]
    ref = _logits(peft_model, batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], ref[real], **within(FWD, ref[real]))
    assert (ref - _logits(hf_model("qwen2"), batch))[real].abs().max() > 1e-3  # the adapter does something


def test_a_peft_adapter_directory_loads_into_megatron(tmp_path):
    adapter = shared_a_adapter(tmp_path / "peft", family="qwen3")
    peft_model = PeftModel.from_pretrained(hf_model("qwen3"), str(adapter)).eval()
    model = megatron_model(save_hf(hf_model("qwen3"), tmp_path / "hf"))
    model.add_adapter_to_model("loaded", str(adapter))
    batch = make_batch(seed=4, ragged=False)
    ours = model.forward_only(inputs=batch)["logits"]
    ref = _logits(peft_model, batch)
    torch.testing.assert_close(ours, ref, **within(FWD, ref))
    assert (ours - _logits(hf_model("qwen3"), batch)).abs().max() > 1e-3  # the loaded adapter is in effect


def test_peft_adapters_with_separate_q_k_v_matrices_are_refused(tmp_path):
    peft_model = get_peft_model(hf_model("qwen2"), LoraConfig(r=2, target_modules=TARGETS))
    peft_model.save_pretrained(str(tmp_path / "peft"))
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path / "hf"))
    with pytest.raises(MegatronConfigError, match=r"different LoRA A matrices.*Only adapters whose A is shared"):
        model.add_adapter_to_model("loaded", str(tmp_path / "peft"))
    assert "loaded" not in model.optimizer_group and list(model.optimizer_group) == ["default"]
    assert not any(isinstance(m, LoraParallelLinear) for m in model.gpt.modules())  # layers unwrapped again


def test_partial_fused_targets_are_refused_before_the_model_changes(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path))
    with pytest.raises(MegatronConfigError, match=r"\['q_proj', 'v_proj'\] without \['k_proj'\].*Add \['k_proj'\]"):
        model.add_adapter_to_model("a", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(MegatronConfigError, match=r"use_dora=True\) is not supported"):
        model.add_adapter_to_model("a", LoraConfig(r=4, target_modules=TARGETS, use_dora=True))
    assert not any(isinstance(m, LoraParallelLinear) for m in model.gpt.modules())
    assert all(p.requires_grad for p in model.gpt.parameters())


def test_lora_training_moves_only_its_adapter_and_lowers_the_loss(tmp_path):
    model = megatron_model(save_hf(hf_model("llama"), tmp_path))
    base = {k.replace(".base_layer", ""): v.clone() for k, v in model.gpt.state_dict().items() if "weight" in k}
    model.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.add_adapter_to_model("b", LoraConfig(r=4, lora_alpha=8, target_modules=["o_proj", "down_proj"]))
    model.set_optimizer("default", lr=2e-2, adapter_name="a")
    b_before = model.get_state_dict(adapter_name="b")
    batch = make_batch(seed=5)
    losses = []
    for _ in range(5):
        losses.append(model.forward_backward(inputs=batch, adapter_name="a"))
        model.clip_grad_and_step(1.0, adapter_name="a")
    assert losses[-1] < losses[0] - 0.05
    after = {k.replace(".base_layer", ""): v for k, v in model.gpt.state_dict().items()}
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the base model is frozen
    assert all(torch.equal(v, model.get_state_dict(adapter_name="b")[k]) for k, v in b_before.items())
    a_state = model.get_state_dict(adapter_name="a")
    assert "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight" in a_state
    assert any(v.abs().sum() > 0 for k, v in a_state.items() if "lora_B" in k)
    with pytest.raises(ValueError, match=r"2 adapters \(a, b\); pass adapter_name="):
        model.forward_backward(inputs=batch)


def test_a_config_without_targets_gets_pefts_defaults_on_the_fused_layer(tmp_path):
    """peft's default for qwen2 is q_proj + v_proj; megatron's linear_qkv holds q, k and v together."""
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path / "hf"))
    model.add_adapter_to_model("tenant", LoraConfig(r=4, lora_alpha=8))
    assert model.backend.adapters.info["tenant"]["suffixes"] == ["self_attention.linear_qkv"]
    path = model.save("adapter", output_dir=str(tmp_path))
    assert PeftModel.from_pretrained(hf_model("qwen2"), path).peft_config["default"].target_modules == {
        "q_proj", "k_proj", "v_proj"}
