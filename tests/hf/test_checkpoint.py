"""Checkpoint layout, atomic writes, in-process resume, load and get_state_dict."""

from __future__ import annotations

import json

import pytest
import torch
from hf_testing import make_batch, make_model, model_state_hash, tensor_hash
from peft import LoraConfig
from rounding import tiny_qwen, within

import twinkle_hf.model.checkpoint as checkpoint_module
from twinkle.checkpoint import CheckpointError, read_trainer_state


def _trained_lora(seed: int = 0):
    model = make_model(seed=seed)
    model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.set_optimizer("AdamW", lr=1e-2)
    model.set_lr_scheduler("LinearWarmupScheduler", num_warmup_steps=1, num_training_steps=10)
    for i in range(2):
        model.forward_backward(inputs=make_batch(i))
        model.clip_grad_and_step()
    return model


def test_layout_and_trainer_state(tmp_path) -> None:
    model = _trained_lora()
    path = model.save("checkpoint-2", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=8)
    names = {p.name for p in (tmp_path / "checkpoint-2").iterdir()}
    assert names == {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt",
                     "rng_state.pt", "trainer_state.json", "manifest.json"}
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["cur_step"] == 2 and state["consumed_train_samples"] == 8
    assert state["gradient_accumulation_steps"] == 1 and state["version"] == 1
    assert state["adapter_name"] == "sft" and state["has_optimizer_state"] is True
    assert read_trainer_state(path)["cur_step"] == 2
    saved_opt = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert tensor_hash(saved_opt) == tensor_hash(model.optimizer_group["sft"].optimizer.state_dict())


def test_crash_mid_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch) -> None:
    model = _trained_lora()
    model.save("last", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=8)
    before = tensor_hash({p.name: p.read_bytes() for p in sorted((tmp_path / "last").iterdir())})
    model.forward_backward(inputs=make_batch(5))
    model.clip_grad_and_step()

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint_module, "torch_save", crash)  # weights written, then the crash
    with pytest.raises(OSError, match="disk full"):
        model.save("last", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=12)
    assert [p.name for p in tmp_path.iterdir()] == ["last"]  # no temp directory left behind
    after = tensor_hash({p.name: p.read_bytes() for p in sorted((tmp_path / "last").iterdir())})
    assert after == before
    monkeypatch.undo()
    model.save("last", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=12)
    assert read_trainer_state(tmp_path / "last")["cur_step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last"]


def test_resume_restores_everything_in_process(tmp_path) -> None:
    model = _trained_lora(seed=1)
    path = model.save("ck", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=8)
    expected = model_state_hash(model)
    fresh = make_model(seed=99)  # different init: everything must come from the checkpoint
    fresh.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    fresh.set_optimizer("AdamW", lr=1e-2)
    fresh.set_lr_scheduler("LinearWarmupScheduler", num_warmup_steps=1, num_training_steps=10)
    progress = fresh.resume_from_checkpoint(path, adapter_name="sft")
    assert progress == {"cur_step": 2, "consumed_train_samples": 8, "gradient_accumulation_steps": 1}
    assert tensor_hash(fresh.get_state_dict()) == tensor_hash(model.get_state_dict())
    assert tensor_hash(fresh.optimizer_group["sft"].optimizer.state_dict()) == \
        tensor_hash(model.optimizer_group["sft"].optimizer.state_dict())
    assert fresh.optimizer_group["sft"].lr_scheduler.state_dict()["last_epoch"] == 2
    assert model_state_hash(model) == expected  # saving changed nothing


def test_resume_only_model_keeps_fresh_optimizer(tmp_path) -> None:
    model = _trained_lora(seed=2)
    path = model.save("ck", output_dir=str(tmp_path))  # weights only
    fresh = make_model(seed=2)
    fresh.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    fresh.set_optimizer("AdamW", lr=1e-2)
    progress = fresh.resume_from_checkpoint(path, resume_only_model=True)
    assert progress["cur_step"] == 2
    assert tensor_hash(fresh.get_state_dict()) == tensor_hash(model.get_state_dict())
    assert fresh.optimizer_group["sft"].optimizer.state_dict()["state"] == {}


def test_full_model_resume_via_model_id_and_load(tmp_path) -> None:
    """seed 000: full-parameter resume passes the checkpoint as model_id, then resume_from_checkpoint."""
    from twinkle.model import TransformersModel

    model = make_model(seed=3)
    model.set_optimizer("AdamW", lr=1e-3)
    model.forward_backward(inputs=make_batch(0))
    model.clip_grad_and_step()
    path = model.save("last-checkpoint", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=4)
    restored = TransformersModel(model_id=path, mixed_precision="no")
    restored.set_optimizer("AdamW", lr=1e-3)
    assert restored.resume_from_checkpoint(path)["cur_step"] == 1
    assert tensor_hash(restored.get_state_dict()) == tensor_hash(model.get_state_dict())
    batch = make_batch(1)
    assert restored.forward_backward(inputs=batch) == model.forward_backward(inputs=batch)

    other = make_model(seed=4)
    other.load("last-checkpoint", output_dir=str(tmp_path))
    assert tensor_hash(other.get_state_dict()) == tensor_hash(model.get_state_dict())


def test_checkpoint_of_the_embedded_model_is_self_contained_in_plain_transformers(tmp_path) -> None:
    """No set_template: the tokenizer and chat template still come along (from the model's own directory),
    and plain transformers + peft rebuild the same model from the shipped base weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle.hub import resolve_path
    from twinkle.model import TransformersModel

    model = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj", "lm_head"]))
    model.set_optimizer("AdamW", lr=5e-2)
    batch = make_batch(0, vocab=model.model.config.vocab_size)
    for _ in range(2):
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
    path = model.save("ckpt", output_dir=str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(resolve_path("twinkle://tiny-qwen")).chat_template
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_path("twinkle://tiny-qwen")), path)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "who are you?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    want = model.forward_only(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)}).logits
    # plain peft against twinkle's forward: float32's forward bound for one prompt (tests/rounding.py)
    torch.testing.assert_close(plain.eval()(input_ids=ids).logits, want,
                               **within(tiny_qwen(ids.shape[1], 1).forward_bound(), want))
    with plain.disable_adapter():
        assert not torch.allclose(plain(input_ids=ids).logits, want, atol=1e-3)  # the adapter matters


def test_every_save_has_a_manifest_that_resume_checks_before_changing_anything(tmp_path, caplog) -> None:
    """manifest.json (sizes + xxh3) is written last by save(); resume finds bytes changed after saving --
    unless skip_checkpoint_validation=True (a warning; sizes are still checked)."""
    import logging
    import struct

    model = _trained_lora(seed=5)
    path = model.save("ck", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=8)
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert set(manifest["files"]) == {p.name for p in (tmp_path / "ck").iterdir()} - {"manifest.json"}
    weights = tmp_path / "ck" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = struct.pack("<f", 0.5)  # same size, still a valid float: only the checksum can tell
    weights.write_bytes(bytes(data))
    fresh = _trained_lora(seed=6)
    before = model_state_hash(fresh)
    with pytest.raises(CheckpointError, match="adapter_model.safetensors does not match its checksum"):
        fresh.resume_from_checkpoint(path)
    assert model_state_hash(fresh) == before
    caplog.set_level(logging.WARNING, logger="twinkle")
    assert fresh.resume_from_checkpoint(path, skip_checkpoint_validation=True)["cur_step"] == 2
    assert "without checking its files' checksums" in caplog.text
    weights.write_bytes(bytes(data[:-4]))  # truncated: sizes are checked even then
    with pytest.raises(CheckpointError, match="adapter_model.safetensors is .* bytes, the manifest says"):
        fresh.resume_from_checkpoint(path, skip_checkpoint_validation=True)
