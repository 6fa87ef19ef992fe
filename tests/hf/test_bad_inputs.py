"""Every bad input is a clear error naming the value and the fix, and the model state is unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hf_testing import make_batch, make_model, model_state_hash, tensor_hash
from peft import LoraConfig

from twinkle.checkpoint import CheckpointError
from twinkle.errors import ComponentNotFoundError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA model one step in, plus a good checkpoint of it."""
    model = make_model(seed=11)
    model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.set_optimizer("AdamW", lr=1e-2)
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=4)
    model.forward_backward(inputs=make_batch(0))
    model.clip_grad_and_step()
    root = tmp_path_factory.mktemp("ckpts")
    good = Path(model.save("good", output_dir=str(root), save_optimizer=True, consumed_train_samples=4))
    return model, good


def _broken_copy(good: Path, tmp_path: Path) -> Path:
    target = tmp_path / "broken"
    shutil.copytree(good, target)
    return target


def _unchanged(model, call, error, match):
    before = model_state_hash(model)
    with pytest.raises(error, match=match):
        call()
    assert model_state_hash(model) == before


def test_unknown_component_names(trained) -> None:
    model, _ = trained
    _unchanged(model, lambda: model.set_optimizer("AdamWW", lr=1.0), ComponentNotFoundError,
               r"Unknown optimizer 'AdamWW'.*Did you mean 'AdamW'")
    _unchanged(model, lambda: model.set_lr_scheduler("CosineWarmup", num_warmup_steps=1, num_training_steps=2),
               ComponentNotFoundError, r"Unknown lr_scheduler 'CosineWarmup'.*CosineWarmupScheduler")
    _unchanged(model, lambda: model.set_loss("CrossEntropy"), ComponentNotFoundError,
               r"Unknown loss 'CrossEntropy'.*CrossEntropyLoss")
    _unchanged(model, lambda: model.set_optimizer("AdamW", learning_rate=1.0), TypeError,
               r"set_optimizer\(AdamW, learning_rate=1.0\) failed")
    assert model.optimizer_group["sft"].lr_scheduler is not None


def test_lora_targeting_missing_modules(trained) -> None:
    model, _ = trained
    bad = LoraConfig(r=4, target_modules=["q_proj", "query_key_value"])
    _unchanged(model, lambda: model.add_adapter_to_model("other", bad), ValueError,
               r"\['query_key_value'\] do not exist in Qwen2ForCausalLM.*q_proj")
    _unchanged(model, lambda: model.add_adapter_to_model("other", LoraConfig(target_modules=r".*\.qkv")), ValueError,
               "matches no module")
    assert list(model.optimizer_group) == ["sft"] and "other" not in model.model.peft_config
    fresh = make_model()
    _unchanged(fresh, lambda: fresh.add_adapter_to_model("x", bad), ValueError, "do not exist")
    assert list(fresh.optimizer_group) == ["default"] and not fresh.is_peft


def test_adapter_never_added(trained) -> None:
    model, _ = trained
    _unchanged(model, lambda: model.forward_backward(inputs=make_batch(1), adapter_name="nope"), KeyError,
               r"No adapter named 'nope'; this model has: sft. Add it with add_adapter_to_model")
    _unchanged(model, lambda: model.set_optimizer("SGD", lr=1.0, adapter_name="nope"), KeyError, "'nope'")
    _unchanged(model, lambda: model.add_adapter_to_model("sft", LoraConfig(target_modules=["q_proj"])), ValueError,
               "already exists")


def test_checkpoint_missing_files(trained, tmp_path) -> None:
    model, good = trained
    for missing, match in (("optimizer.pt", r"missing optimizer.pt.*save_optimizer=True"),
                           ("adapter_model.safetensors", "has no adapter_model.safetensors"),
                           ("scheduler.pt", "missing scheduler.pt"),
                           ("trainer_state.json", "trainer_state.json' does not exist")):
        broken = _broken_copy(good, tmp_path)
        (broken / missing).unlink()
        _unchanged(model, lambda b=broken: model.resume_from_checkpoint(str(b)), CheckpointError, match)
        shutil.rmtree(broken)
    _unchanged(model, lambda: model.resume_from_checkpoint(str(tmp_path / "nowhere")), CheckpointError,
               "does not exist")


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    (json.dumps({"version": 1, "cur_step": -1, "consumed_train_samples": 0, "gradient_accumulation_steps": 1}),
     "'cur_step' must be a non-negative integer, got -1"),
    (json.dumps({"version": 1, "cur_step": 1, "consumed_train_samples": 0}),
     "'gradient_accumulation_steps' must be a non-negative integer, got None"),
    (json.dumps({"version": 99, "cur_step": 1, "consumed_train_samples": 0, "gradient_accumulation_steps": 1}),
     "version 99 is not supported"),
])
def test_corrupt_trainer_state(trained, tmp_path, content: str, match: str) -> None:
    model, good = trained
    broken = _broken_copy(good, tmp_path)
    (broken / "trainer_state.json").write_text(content)
    _unchanged(model, lambda: model.resume_from_checkpoint(str(broken)), CheckpointError, match)


def test_corrupt_or_unsafe_pickles(trained, tmp_path) -> None:
    model, good = trained
    broken = _broken_copy(good, tmp_path)
    (broken / "optimizer.pt").write_bytes(b"garbage" * 10)
    _unchanged(model, lambda: model.resume_from_checkpoint(str(broken)), CheckpointError, "Could not load .* safely")

    class Payload:
        def __reduce__(self):
            return (print, ("code ran while loading",))

    torch.save({"state": {}, "param_groups": [], "x": Payload()}, broken / "optimizer.pt")
    _unchanged(model, lambda: model.resume_from_checkpoint(str(broken)), CheckpointError, "Could not load .* safely")


def test_checkpoint_of_another_model(trained, tmp_path) -> None:
    model, _ = trained
    other = make_model(seed=1)
    other.add_adapter_to_model("sft", LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    other.set_optimizer("AdamW", lr=1e-2)
    other.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=4)
    path = other.save("r8", output_dir=str(tmp_path), save_optimizer=True)
    _unchanged(model, lambda: model.resume_from_checkpoint(path), CheckpointError, "shape mismatches")
    full = make_model(seed=1)
    full_path = full.save("full", output_dir=str(tmp_path))
    _unchanged(model, lambda: model.load(full_path), CheckpointError, "has no adapter_model.safetensors")


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/tmp/absolute", "~/home", ""])
def test_save_name_escaping_output_dir(trained, tmp_path, name: str) -> None:
    model, _ = trained
    out = tmp_path / "out"
    _unchanged(model, lambda: model.save(name, output_dir=str(out), save_optimizer=True), CheckpointError,
               "output_dir|absolute|non-empty")
    assert not out.exists()
    assert not (tmp_path / "escape").exists()


def test_bad_construction_arguments() -> None:
    with pytest.raises(ValueError, match="mixed_precision='fp32' is not one of no, fp8, fp16, bf16"):
        make_model(mixed_precision="fp32")
    with pytest.raises(ValueError, match="strategy='ddp' is not one of accelerate, native_fsdp"):
        make_model(strategy="ddp")
    with pytest.raises(ValueError, match="'NoSuchModelClass' is not a class exported by transformers"):
        make_model(model_cls="NoSuchModelClass")
    with pytest.raises(ValueError, match="needs model_id=.*or config="):
        from twinkle.model import TransformersModel

        TransformersModel(mixed_precision="no")
    with pytest.raises(ValueError, match="grad_scaler_config=.*mixed_precision='fp16'"):
        make_model(grad_scaler_config={"init_scale": 8.0})


def test_training_calls_out_of_order() -> None:
    model = make_model()
    before = tensor_hash(model.model.state_dict())
    with pytest.raises(RuntimeError, match="needs a forward first"):
        model.calculate_loss()
    with pytest.raises(RuntimeError, match="needs a loss with a graph"):
        model.backward()
    model.forward_only(inputs=make_batch(0))
    model.calculate_loss()
    with pytest.raises(RuntimeError, match="forward_only runs without gradients"):
        model.backward()
    with pytest.raises(RuntimeError, match="set_lr_scheduler needs an optimizer"):
        model.set_lr_scheduler("StepLR", step_size=1)
    model.forward_backward(inputs=make_batch(0))
    with pytest.raises(RuntimeError, match=r"no optimizer: call set_optimizer\(\.\.\., adapter_name='default'\)"):
        model.clip_grad_and_step()
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1, got 0"):
        model.forward_backward(inputs=make_batch(0), gradient_accumulation_steps=0)
    with pytest.raises(TypeError, match="inputs must be a dict of tensors or a non-empty list"):
        model.forward_backward(inputs="text")
    with pytest.raises(ValueError, match="task='classify' is not one of causal_lm, embedding"):
        model.forward(inputs=make_batch(0), task="classify")
    assert tensor_hash(model.model.state_dict()) == before
    assert model.optimizer_group["default"].micro_step == 1  # only the one good forward_backward counted
