"""Hostile checkpoints through the model API (``resume_from_checkpoint``) and the checkpoint helpers: progress
out of any run's range, a deleted manifest, another optimizer's state, save names with '.' parts and rotation
racing another process. Every refusal leaves the model as it was."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import pytest
import torch
from hostile_testing import lora_model, train_step

from twinkle.checkpoint import CheckpointError, rotate
from twinkle.checkpoint.manifest import MANIFEST_FILE, write_manifest


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A checkpoint of adapter 'sft' after one AdamW step, saved with its optimizer."""
    model = lora_model()
    train_step(model, seed=1, adapter_name="sft")
    return Path(model.save("ck", output_dir=str(tmp_path_factory.mktemp("saved")), adapter_name="sft",
                           save_optimizer=True))


@pytest.fixture
def checkpoint(saved, tmp_path) -> Path:
    path = tmp_path / "ck"
    shutil.copytree(saved, path)
    return path


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.get_state_dict(adapter_name="sft").items()}


def _unchanged(model, before: dict[str, torch.Tensor], step: int = 0) -> None:
    after = model.get_state_dict(adapter_name="sft")
    assert all(torch.equal(before[k], after[k]) for k in before)  # integer-exact: nothing was loaded
    assert model.optimizer_group["sft"].cur_step == step


def _tamper_state(path: Path, **fields) -> None:
    """Edit trainer_state.json and rewrite the manifest over it (a careless tool, not bit rot)."""
    state_file = path / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), **fields}))
    (path / MANIFEST_FILE).unlink()
    write_manifest(path)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"version": 0}, "version 0 is not supported"),
    ({"version": True}, "version True is not supported"),
    ({"cur_step": 10**30}, "'cur_step' is 1000000000000000000000000000000, beyond what any run reaches"),
    ({"gradient_accumulation_steps": 10**9}, "'gradient_accumulation_steps' is 1000000000, beyond"),
    ({"consumed_train_samples": 2**70}, "'consumed_train_samples' is 1180591620717411303424, beyond"),
])
def test_progress_out_of_range_is_refused_and_nothing_changes(checkpoint, fields, needle) -> None:
    _tamper_state(checkpoint, **fields)
    model = lora_model()
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=needle):
        model.resume_from_checkpoint(str(checkpoint), adapter_name="sft")
    _unchanged(model, before)


def test_a_huge_integer_is_a_checkpoint_error_not_a_raw_one(checkpoint) -> None:
    state_file = checkpoint / "trainer_state.json"
    state_file.write_text(state_file.read_text().replace('"cur_step": 1', '"cur_step": 1' + "0" * 5000))
    with pytest.raises(CheckpointError, match=r"trainer_state.json' is not valid JSON"):
        lora_model().resume_from_checkpoint(str(checkpoint), adapter_name="sft")


def test_a_deleted_manifest_is_refused_unless_the_caller_vouches(checkpoint) -> None:
    weights = checkpoint / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\x00" * 64  # a tampered adapter whose manifest was deleted to hide it
    weights.write_bytes(bytes(data))
    (checkpoint / MANIFEST_FILE).unlink()
    model = lora_model()
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=r"has no manifest.json.*pass pre_manifest=True"):
        model.resume_from_checkpoint(str(checkpoint), adapter_name="sft")
    _unchanged(model, before)
    progress = model.resume_from_checkpoint(str(checkpoint), adapter_name="sft", pre_manifest=True)
    assert progress["cur_step"] == 1  # a checkpoint from before manifests still resumes when asked to


def test_another_optimizers_state_is_named_as_such(checkpoint) -> None:
    model = lora_model()
    model.set_optimizer("SGD", lr=0.1, momentum=0.9, adapter_name="sft")
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=8, adapter_name="sft")
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=r"optimizer.pt' does not fit group 'sft''s optimizer: the saved "
                                              r"optimizer state lacks \['dampening', 'momentum'\], which this SGD"):
        model.resume_from_checkpoint(str(checkpoint), adapter_name="sft")
    _unchanged(model, before)


@pytest.mark.parametrize("name", [".", "./", "a/./b", "a/.", "./a", "a//../b", "a\\..\\b"])
def test_save_names_with_dot_parts_are_refused(tmp_path, name) -> None:
    model = lora_model()
    (tmp_path / "mine.txt").write_text("keep\n")
    with pytest.raises(CheckpointError, match=r"is not a plain name below output_dir"):
        model.save(name, output_dir=str(tmp_path / "out"), adapter_name="sft")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # nothing written, output_dir not made


def _family(root: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        path = root / f"step-{i:08d}"
        path.mkdir()
        (path / "weights.bin").write_bytes(b"x" * 10)
        paths.append(path)
    return paths


def test_rotate_over_a_member_another_process_deleted(tmp_path) -> None:
    family = _family(tmp_path, 5)
    shutil.rmtree(family[1])  # another job rotated it away after this one listed the family
    gone = rotate(family, 2)
    assert gone == family[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def _rotate_many(family: list[str], barrier) -> None:
    barrier.wait()  # every process lists the same family, then they all rotate it at once
    rotate([Path(p) for p in family], 3)


def test_concurrent_rotations_of_one_family_agree(tmp_path) -> None:
    family = [str(p) for p in _family(tmp_path, 40)]
    ctx = multiprocessing.get_context("fork")  # the workers only rename and delete files
    barrier = ctx.Barrier(4)
    workers = [ctx.Process(target=_rotate_many, args=(family, barrier)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]  # no process raised (FileNotFoundError before)
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(p).name for p in family[-3:]]  # no trash left
