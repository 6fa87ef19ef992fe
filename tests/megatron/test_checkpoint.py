"""save / load / resume of MegatronModel: HF-loadable output, bit-identical round trip, exact resume on CPU."""

from __future__ import annotations

import json

import pytest
import torch
from megatron_testing import hf_model, make_batch, megatron_model, save_hf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from twinkle.checkpoint import CheckpointError


def test_load_then_save_is_bit_identical_to_the_hf_files(tmp_path):
    source = save_hf(hf_model("qwen3"), tmp_path / "hf")
    model = megatron_model(source)
    saved = model.save("copy", output_dir=str(tmp_path))
    original, written = load_file(str(source / "model.safetensors")), load_file(f"{saved}/model.safetensors")
    assert set(written) == set(original)
    assert all(torch.equal(written[k], original[k]) for k in original)
    assert json.loads((tmp_path / "copy" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_trained_weights_load_in_transformers_with_the_same_logits(tmp_path):
    model = megatron_model(save_hf(hf_model("llama"), tmp_path / "hf"))
    model.set_optimizer("default", lr=1e-2)
    model.forward_backward(inputs=make_batch(seed=1))
    model.clip_grad_and_step(1.0)
    path = model.save("trained", output_dir=str(tmp_path))
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    batch = make_batch(seed=2)
    with torch.no_grad():
        ref = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ours = model.forward_only(inputs=batch)["logits"]
    real = batch["attention_mask"].bool()
    assert (ours[real] - ref[real]).abs().max() <= 2e-5
    untrained = hf_model("llama")
    with torch.no_grad():
        assert (untrained(input_ids=batch["input_ids"]).logits - ref).abs().max() > 1e-4  # the step is in the file


def _train(model, steps, start=0):
    losses = []
    for step in range(start, start + steps):
        for micro in range(2):
            losses.append(model.forward_backward(inputs=make_batch(seed=100 + 2 * step + micro),
                                                 gradient_accumulation_steps=2))
        model.clip_grad_and_step(1.0)
    return losses


def _fresh(path):
    model = megatron_model(path)
    model.set_optimizer("default", lr=5e-3, weight_decay=0.01)
    model.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=4, lr_decay_style="linear")
    return model


def test_resume_continues_the_exact_loss_trajectory(tmp_path):
    source = save_hf(hf_model("qwen2"), tmp_path / "hf")
    straight = _train(_fresh(source), 4)

    first = _fresh(source)
    head = _train(first, 2)
    checkpoint = first.save("step-2", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=16)
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pt", "trainer_state.json", "model.safetensors"} <= {
        p.name for p in (tmp_path / "step-2").iterdir()}

    resumed = _fresh(checkpoint)  # full-model weights come from the checkpoint directory, as with HF
    progress = resumed.resume_from_checkpoint(checkpoint)
    assert progress == {"cur_step": 2, "consumed_train_samples": 16, "gradient_accumulation_steps": 2}
    tail = _train(resumed, 2, start=2)
    assert head + tail == straight  # bitwise: same floats, not approximately


def test_failed_loads_leave_the_model_unchanged(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path / "a"))
    before = model.get_state_dict()
    other = save_hf(hf_model("qwen2", intermediate_size=96), tmp_path / "b")
    with pytest.raises(CheckpointError, match=r"linear_fc1.weight: the checkpoint gives shape \(192, 64\)"):
        model.load(str(other))
    assert all(torch.equal(before[k], v) for k, v in model.get_state_dict().items())

    checkpoint = model.save("ck", output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"has none: call set_optimizer\('default', \.\.\.\)"):
        model.resume_from_checkpoint(checkpoint)
    model.set_optimizer("default", lr=1e-3)
    with pytest.raises(CheckpointError, match=r"is missing rng_state.pt.*Save it with save_optimizer=True"):
        model.resume_from_checkpoint(checkpoint)  # saved without save_optimizer=True
    (tmp_path / "ck" / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        model.resume_from_checkpoint(checkpoint)
    assert all(torch.equal(before[k], v) for k, v in model.get_state_dict().items())


def test_a_checkpoint_name_cannot_escape_output_dir(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="is not a plain name below output_dir"):
        model.save("../outside", output_dir=str(tmp_path / "out"))
    assert not (tmp_path / "outside").exists()


def test_a_checkpoint_carries_the_source_tokenizer_and_async_save_is_refused(tmp_path):
    from transformers import AutoTokenizer

    from twinkle.template import Template

    source = save_hf(hf_model("qwen2"), tmp_path / "hf")
    Template().tokenizer.save_pretrained(str(source))  # a model directory with its tokenizer, as on the hub
    model = megatron_model(source)
    path = model.save("with-tokenizer", output_dir=str(tmp_path / "out"))
    tokenizer = AutoTokenizer.from_pretrained(path)  # the checkpoint directory is self-contained
    assert tokenizer("hello")["input_ids"] == AutoTokenizer.from_pretrained(str(source))("hello")["input_ids"]
    with pytest.raises(NotImplementedError, match="MegatronModel cannot save in the background"):
        model.save("async", output_dir=str(tmp_path / "out"), async_save=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["with-tokenizer"]
