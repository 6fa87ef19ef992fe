"""LoRA through peft: several adapters on one model, each its own group; PEFT-loadable checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_testing import make_batch, make_model
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM


def _lora(r: int = 4) -> LoraConfig:
    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], init_lora_weights=False)


def test_adapter_forward_matches_plain_peft() -> None:
    model = make_model(seed=1)
    base = copy.deepcopy(model.model)
    torch.manual_seed(5)
    model.add_adapter_to_model("sft", _lora())
    torch.manual_seed(5)
    from peft import get_peft_model

    reference = get_peft_model(base, _lora(), adapter_name="sft").eval()
    batch = make_batch(0)
    out = model.forward_only(inputs=batch)
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(out.logits, expected, rtol=0, atol=0)
    assert list(model.optimizer_group) == ["sft"]  # the full-model group gave way to the adapter


def test_two_adapters_train_independently() -> None:
    model = make_model(seed=2)
    model.add_adapter_to_model("first", _lora(4), gradient_accumulation_steps=1)
    model.add_adapter_to_model("second", _lora(8), gradient_accumulation_steps=2)
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="first")
    model.set_optimizer("SGD", lr=1e-1, adapter_name="second")
    model.set_loss("CrossEntropyLoss", adapter_name="second", reduction="sum")
    base_before = {k: v.clone() for k, v in model.backend.hf_model().state_dict().items() if "lora" not in k}
    second_before = {k: v.clone() for k, v in model.get_state_dict(adapter_name="second").items()}

    model.forward_backward(inputs=make_batch(1), adapter_name="first")
    model.clip_grad_and_step(adapter_name="first")
    first_after = model.get_state_dict(adapter_name="first")
    assert model.optimizer_group["first"].cur_step == 1
    assert all(torch.equal(v, second_before[k]) for k, v in model.get_state_dict(adapter_name="second").items())

    for seed in (2, 3):
        model.forward_backward(inputs=make_batch(seed), adapter_name="second")
        model.clip_grad_and_step(adapter_name="second")
    assert model.optimizer_group["second"].cur_step == 1
    assert any(not torch.equal(v, second_before[k]) for k, v in model.get_state_dict(adapter_name="second").items())
    assert all(torch.equal(v, first_after[k]) for k, v in model.get_state_dict(adapter_name="first").items())
    base_after = {k: v for k, v in model.backend.hf_model().state_dict().items() if "lora" not in k}
    assert all(torch.equal(base_after[k], v) for k, v in base_before.items())
    with pytest.raises(ValueError, match="pass adapter_name="):
        model.forward_backward(inputs=make_batch(4))


def test_each_adapter_runs_only_itself() -> None:
    """Outputs of adapter A do not depend on adapter B's weights."""
    model = make_model(seed=3)
    model.add_adapter_to_model("first", _lora())
    batch = make_batch(5)
    alone = model.forward_only(inputs=batch, adapter_name="first").logits
    model.add_adapter_to_model("second", _lora())
    with_other = model.forward_only(inputs=batch, adapter_name="first").logits
    other = model.forward_only(inputs=batch, adapter_name="second").logits
    torch.testing.assert_close(alone, with_other, rtol=0, atol=0)
    assert not torch.allclose(alone, other)


def test_saved_adapter_loads_with_plain_peft(tmp_path) -> None:
    model = make_model(seed=4)
    base = copy.deepcopy(model.model)
    model.add_adapter_to_model("first", _lora())
    model.add_adapter_to_model("second", _lora())
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="second")
    model.forward_backward(inputs=make_batch(6), adapter_name="second")
    model.clip_grad_and_step(adapter_name="second")
    path = model.save("adapter-second", output_dir=str(tmp_path), adapter_name="second")
    files = {p.name for p in (tmp_path / "adapter-second").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.json"} <= files
    assert not any(name.endswith((".bin", ".pt")) for name in files)  # weights only: no optimizer asked for

    loaded = PeftModel.from_pretrained(base, path).eval()
    batch = make_batch(7)
    expected = model.forward_only(inputs=batch, adapter_name="second").logits
    with torch.no_grad():
        got = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_adapter_added_from_a_saved_directory(tmp_path) -> None:
    model = make_model(seed=5)
    model.add_adapter_to_model("sft", _lora())
    path = model.save("sft", output_dir=str(tmp_path))
    fresh = make_model(seed=5)
    fresh.add_adapter_to_model("restored", path)
    batch = make_batch(8)
    torch.testing.assert_close(fresh.forward_only(inputs=batch).logits, model.forward_only(inputs=batch).logits,
                               rtol=0, atol=0)
    fresh.set_optimizer("SGD", lr=0.1)  # trainable again
    assert all(p.requires_grad for p in fresh.backend.parameters(fresh.optimizer_group["restored"]))


def test_full_checkpoint_loads_with_transformers(tmp_path) -> None:
    model = make_model(seed=6)
    model.set_optimizer("AdamW", lr=1e-2)
    model.forward_backward(inputs=make_batch(9))
    model.clip_grad_and_step()
    path = model.save("full", output_dir=str(tmp_path), save_optimizer=True)
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    batch = make_batch(10)
    with torch.no_grad():
        got = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(got, model.forward_only(inputs=batch).logits, rtol=0, atol=0)
    assert (tmp_path / "full" / "model.safetensors").is_file()
