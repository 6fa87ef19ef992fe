"""Hostile resume state and manifests through the Trainer: a checkpoint whose progress this run could not have
reached, or whose manifest proves nothing, is refused before anything is loaded, and auto_resume falls back.

Each tampering recomputes both manifests (the model's and the checkpoint's), as a careless tool would and bit
rot would not: what is tested is that the state is validated, not that the checksums notice the edit.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hostile_testing import copy_run as _copy
from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.checkpoint import CheckpointError
from twinkle.checkpoint.manifest import write_manifest
from twinkle.config import ConfigError
from twinkle.trainer import Trainer, store

STEP2, STEP4 = "step-00000002", "step-00000004"


def _recompute_manifests(path: Path) -> None:
    """Rewrite the model's manifest, then the checkpoint's, over the files as they now are."""
    (path / "model" / "manifest.json").unlink()
    write_manifest(path / "model")
    step = json.loads((path / "manifest.json").read_text())["step"]
    (path / "manifest.json").unlink()
    write_manifest(path, step=step)


def _edit_json(file: Path, **fields) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **fields}))


def _edit_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest["files"])
    (path / "manifest.json").write_text(json.dumps(manifest))


def _resumes_from_step2(wd: Path, caplog, *needles: str, total_step: int = 4) -> None:
    """auto_resume skips the newest checkpoint, saying why (``needles``), and redoes steps 3-4 from step 2."""
    caplog.set_level(logging.INFO, logger="twinkle")
    result = Trainer(**tiny_job(wd, total_step=total_step, auto_resume=True)).fit()
    assert result.resumed_from == str(wd / "checkpoints" / STEP2)
    assert result.step == total_step
    assert "falling back" in caplog.text and STEP4 in caplog.text
    for needle in needles:
        assert needle in caplog.text


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("cur_step", 10**30, "'cur_step' is 1000000000000000000000000000000, beyond"),
    ("cur_step", 3, "'cur_step' is 3, but the checkpoint is step 4"),
    ("consumed_train_samples", 2**70, "'consumed_train_samples' is 1180591620717411303424, beyond"),
    ("gradient_accumulation_steps", 10**9, "'gradient_accumulation_steps' is 1000000000, beyond"),
    ("version", 0, "version 0 is not supported"),
])
def test_hostile_model_progress_falls_back(finished, tmp_path, caplog, field, value, needle) -> None:
    wd, newest = _copy(finished, tmp_path)
    reference = load_weights(newest / "model")
    _edit_json(newest / "model" / "trainer_state.json", **{field: value})
    _recompute_manifests(newest)
    _resumes_from_step2(wd, caplog, needle, "trainer_state.json")
    assert_bitwise_equal(load_weights(newest / "model"), reference)  # steps 3-4 redone exactly from step 2


def test_a_damaged_stream_position_falls_back(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    _edit_json(newest / store.TRAINER_FILE, stream_position=[0, "2", 0])
    _recompute_manifests(newest)
    _resumes_from_step2(wd, caplog, "field 'stream_position' must be [epoch, chunk, offset]")


def test_consumed_samples_beyond_what_the_steps_took_fall_back(finished, tmp_path, caplog) -> None:
    # 4 steps of 4 rows took 16; 1000 is on a batch boundary, agrees between the two files, and is refused
    wd, newest = _copy(finished, tmp_path)
    _edit_json(newest / "model" / "trainer_state.json", consumed_train_samples=1000)
    _edit_json(newest / store.TRAINER_FILE, consumed_train_samples=1000)
    _recompute_manifests(newest)
    _resumes_from_step2(wd, caplog, "'consumed_train_samples' is 1000, more than the 16 rows")


def test_rows_of_skipped_windows_count_as_taken(finished, tmp_path) -> None:
    # two windows skipped (inf/NaN) took 2 x 4 rows without a step: 4 steps may then have consumed 24 rows
    wd, newest = _copy(finished, tmp_path)
    state = json.loads((newest / store.TRAINER_FILE).read_text())
    assert (state["skipped_windows"], state["rows_per_step"], state["optimizer"]) == (0, 4, "AdamW")  # recorded
    _edit_json(newest / "model" / "trainer_state.json", consumed_train_samples=24)
    _edit_json(newest / store.TRAINER_FILE, consumed_train_samples=24, skipped_windows=2)
    _recompute_manifests(newest)
    result = Trainer(**tiny_job(wd, total_step=5, auto_resume=True)).fit()
    assert result.resumed_from == str(newest) and result.step == 5


def test_accumulation_that_disagrees_with_the_config_is_refused(finished, tmp_path, caplog) -> None:
    wd, _ = _copy(finished, tmp_path)
    caplog.set_level(logging.INFO, logger="twinkle")
    job = tiny_job(wd, total_step=6, auto_resume=True, dataloader={"gradient_accumulation_steps": 4})
    with pytest.raises(CheckpointError, match=r"'gradient_accumulation_steps' is 2, this run accumulates 4.*"
                                              r"start a new run"):
        Trainer(**job).fit()
    assert "starting from scratch" not in caplog.text
    assert not (wd / "checkpoints" / "step-00000006").exists()


def test_total_step_below_the_checkpoint_is_refused(finished, tmp_path) -> None:
    wd, _ = _copy(finished, tmp_path)
    with pytest.raises(ConfigError, match=r"total_step: this run trains 3 steps.*at step 4.*raise total_step"):
        Trainer(**tiny_job(wd, total_step=3, auto_resume=True)).fit()


def test_another_optimizer_is_named_as_such(finished, tmp_path) -> None:
    wd, newest = _copy(finished, tmp_path)
    with pytest.raises(ConfigError, match=r"optimizer.name: 'SGD'.*trained with 'AdamW'.*load_from"):
        Trainer(**tiny_job(wd, total_step=6, auto_resume=True, optimizer={"name": "SGD"})).fit()
    # a checkpoint that does not record its optimizer: the optimizer state itself is compared
    for path in (wd / "checkpoints").iterdir():
        state = json.loads((path / store.TRAINER_FILE).read_text())
        del state["optimizer"]
        (path / store.TRAINER_FILE).write_text(json.dumps(state))
        _recompute_manifests(path)
    with pytest.raises(CheckpointError, match=r"lacks \['dampening', 'momentum'\].*SGD.*another optimizer type"):
        Trainer(**tiny_job(wd, total_step=6, auto_resume=True, optimizer={"name": "SGD"})).fit()


def _flip_adapter(path: Path) -> None:
    weights = path / "model" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # same size; float32 0xffffffff is NaN
    weights.write_bytes(bytes(data))


def test_manifest_listing_no_files_proves_nothing(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    _flip_adapter(newest)
    for directory in (newest / "model", newest):
        _edit_manifest(directory, lambda files: files.clear())
    _resumes_from_step2(wd, caplog, "lists no files")


def test_file_present_but_unlisted_fails_verification(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    _flip_adapter(newest)
    _edit_manifest(newest / "model", lambda files: files.pop("adapter_model.safetensors"))
    _edit_manifest(newest, lambda files: files.pop("model/adapter_model.safetensors"))
    _resumes_from_step2(wd, caplog, "model/adapter_model.safetensors, which manifest.json does not list")


def test_manifest_path_outside_the_checkpoint_is_refused(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    outside = tmp_path / "hostname"
    outside.write_text("host\n")
    escape = "../" * len(newest.relative_to(tmp_path).parts) + "hostname"
    assert (newest / escape).resolve() == outside.resolve()
    _edit_manifest(newest, lambda files: files.update({escape: {"size": 5}}))
    _resumes_from_step2(wd, caplog, "which is not a file inside the checkpoint")


@pytest.mark.parametrize("entry", [["size", 1], "12", None, {"size": "12"}, {"size": True}])
def test_manifest_entry_of_the_wrong_type_falls_back(finished, tmp_path, caplog, entry) -> None:
    wd, newest = _copy(finished, tmp_path)
    _edit_manifest(newest, lambda files: files.update({"trainer.json": entry}))
    _resumes_from_step2(wd, caplog, "manifest.json's entry for 'trainer.json'")


def test_trainer_file_of_the_wrong_type_falls_back(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    (newest / store.TRAINER_FILE).write_text(json.dumps({"step": "4", "consumed_train_samples": 16}))
    _recompute_manifests(newest)
    _resumes_from_step2(wd, caplog, "field 'step' must be a non-negative integer")


def test_load_from_a_yaml_file_names_the_option(tmp_path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("total_step: 1\n")
    with pytest.raises(ConfigError, match=r"load_from: .*job.yaml' is a file \(a config file: twinkle train"):
        Trainer(**tiny_job(tmp_path / "wd", total_step=1, load_from=str(config))).fit()
    assert not (tmp_path / "wd").exists()  # refused before anything was written
