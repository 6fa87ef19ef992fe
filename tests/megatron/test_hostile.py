"""Issue 13 on MegatronModel: the shared core checks at every megatron call site (CPU stand-in optimizer)."""

from __future__ import annotations

import shutil

import pytest
import torch
from megatron_testing import VOCAB, hf_model, make_batch, megatron_model, save_hf

from twinkle.checkpoint import CheckpointError, capture_rng_state, torch_save


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model with an optimizer and scheduler, one step in, a checkpoint of it, then one more step."""
    root = tmp_path_factory.mktemp("megatron_hostile")
    model = megatron_model(save_hf(hf_model("qwen2"), root / "hf"))
    model.set_optimizer("default", lr=5e-3)
    model.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=4, lr_decay_style="linear")
    model.forward_backward(inputs=make_batch(seed=1))
    model.clip_grad_and_step(1.0)
    checkpoint = model.save("good", output_dir=str(root), save_optimizer=True)
    model.forward_backward(inputs=make_batch(seed=2))
    model.clip_grad_and_step(1.0)
    return model, checkpoint


def _snapshot(model):
    group = model.optimizer_group["default"]
    return ({k: v.clone() for k, v in model.get_state_dict().items()},
            {k: v.clone() for k, v in group.optimizer.optimizer.state_dict()["state"][0].items()},
            group.lr_scheduler.state_dict()["num_steps"], group.cur_step, torch.get_rng_state())


def _same(a, b) -> bool:
    weights = a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    moments = all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    return weights and moments and a[2:4] == b[2:4] and torch.equal(a[4], b[4])


@pytest.mark.parametrize("file,content,match", [
    ("rng_state.pt", lambda: {**capture_rng_state(), "torch": torch.zeros(3, dtype=torch.uint8)}, "malformed"),
    ("scheduler.pt", lambda: {"num_steps": "many"}, "does not fit"),
])
def test_a_malformed_side_file_changes_nothing(trained, tmp_path, file, content, match) -> None:
    model, checkpoint = trained
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    torch_save(content(), broken / file)
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=match):
        model.resume_from_checkpoint(str(broken))
    assert _same(_snapshot(model), before)


def test_save_refuses_a_user_directory_and_non_finite_weights(trained, tmp_path) -> None:
    model, _ = trained
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    with pytest.raises(CheckpointError, match="Refusing to replace .*thesis.tex.*overwrite=True"):
        model.save("mine", output_dir=str(tmp_path))
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"
    name, param = model.backend.adapters.named_parameters(model.optimizer_group["default"])[0]
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.view(-1)[0] = float("inf")
        with pytest.raises(CheckpointError, match=r"non-finite .*allow_non_finite=True"):
            model.save("diverged", output_dir=str(tmp_path))
        assert not (tmp_path / "diverged").exists()
    finally:
        with torch.no_grad():
            param.copy_(saved)


def test_bad_lr_bad_batch_and_bad_adapter_name_are_refused(trained) -> None:
    model, _ = trained
    before = _snapshot(model)
    for lr in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="finite number >= 0"):
            model.set_optimizer("default", lr=lr)
    batch = make_batch(seed=3)
    batch["input_ids"][0, 0] = VOCAB
    with pytest.raises(ValueError, match=rf"token id {VOCAB}, outside .*\[0, {VOCAB}\)"):
        model.forward_backward(inputs=batch)
    batch = make_batch(seed=3)
    batch["labels"] = batch["labels"][:, :-1]
    with pytest.raises(ValueError, match=r"labels has shape \(4, 11\) but input_ids has \(4, 12\)"):
        model.forward_backward(inputs=batch)
    from peft import LoraConfig

    with pytest.raises(ValueError, match="identifier-like"):
        model.add_adapter_to_model("tenant\n", LoraConfig(r=2, target_modules=["q_proj"]))
    assert _same(_snapshot(model), before)
