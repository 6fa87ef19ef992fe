"""Issue 13 items 3 and 4 through the Trainer: any load failure falls back, checksums catch flipped bytes,
and a model is never trained on from a checkpoint that could not be loaded."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from hostile_testing import copy_run as _copy
from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.checkpoint import CheckpointError, capture_rng_state, torch_save
from twinkle.trainer import Trainer, store


def _rewrite_manifest(path: Path) -> None:
    """Make a damaged checkpoint consistent with its manifest (as a buggy writer would have left it)."""
    trainer_state = json.loads((path / store.TRAINER_FILE).read_text())
    (path / "manifest.json").unlink()
    store._finish(path, trainer_state["step"], trainer_state)


def _malformed_rng(path: Path) -> None:
    state = capture_rng_state()
    state["numpy"]["keys"] = state["numpy"]["keys"][:10]  # unpickles fine; numpy refuses it
    torch_save(state, path / "model" / "rng_state.pt")
    _rewrite_manifest(path)


def test_any_load_failure_falls_back_to_the_previous_checkpoint(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    reference = load_weights(newest / "model")
    _malformed_rng(newest)
    caplog.set_level(logging.INFO, logger="twinkle")
    result = Trainer(**tiny_job(wd, total_step=4, auto_resume=True)).fit()
    assert "step-00000004" in caplog.text and "falling back" in caplog.text and "rng_state.pt" in caplog.text
    assert result.resumed_from == str(wd / "checkpoints" / "step-00000002") and result.step == 4
    assert_bitwise_equal(load_weights(newest / "model"), reference)  # steps 3-4 redone exactly


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    shutil.rmtree(wd / "checkpoints" / "step-00000002")
    _malformed_rng(newest)
    caplog.set_level(logging.INFO, logger="twinkle")
    with pytest.raises(CheckpointError, match=r"auto_resume.*step-00000004.*rng_state\.pt.*auto_resume"):
        Trainer(**tiny_job(wd, total_step=6, auto_resume=True)).fit()
    assert "starting from scratch" not in caplog.text
    assert not (wd / "checkpoints" / "step-00000006").exists()


def test_flipped_bytes_are_caught_by_the_checksum_and_skipped(finished, tmp_path, caplog) -> None:
    wd, newest = _copy(finished, tmp_path)
    reference = {k: v.clone() for k, v in load_weights(newest / "model").items()}  # safetensors maps the file
    weights = newest / "model" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # same size; float32 0xffffffff is NaN
    weights.write_bytes(bytes(data))

    caplog.set_level(logging.INFO, logger="twinkle")
    result = Trainer(**tiny_job(wd, total_step=4, auto_resume=True)).fit()
    assert result.resumed_from == str(wd / "checkpoints" / "step-00000002")
    assert "adapter_model.safetensors does not match its checksum" in caplog.text
    assert math.isfinite(result.final_loss)
    assert_bitwise_equal(load_weights(newest / "model"), reference)
    manifest = json.loads((newest / "manifest.json").read_text())
    assert all(len(entry["xxh3_64"]) == 16 for entry in manifest["files"].values())  # every file has a checksum


def test_save_refuses_non_finite_trainable_weights(tmp_path) -> None:
    from hostile_testing import lora_model

    model = lora_model()
    name, param = next((n, p) for n, p in model.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        param[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=rf"non-finite.*{name.split('.')[-3]}.*allow_non_finite=True"):
        model.save("nan", output_dir=str(tmp_path), save_optimizer=True)
    assert not (tmp_path / "nan").exists()
    path = model.save("nan", output_dir=str(tmp_path), allow_non_finite=True)
    assert Path(path, "adapter_model.safetensors").is_file()
