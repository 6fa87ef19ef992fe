"""Issue 13 item 3: a resume checks every file before it changes anything; on failure nothing changed."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_testing import model_state_hash
from hostile_testing import lora_model, train_step

from twinkle.checkpoint import CheckpointError, capture_rng_state, torch_save


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint after one step; the model has trained a second step since (it differs from the file)."""
    model = lora_model()
    train_step(model, 0)
    root = tmp_path_factory.mktemp("ckpt")
    good = Path(model.save("good", output_dir=str(root), save_optimizer=True, consumed_train_samples=4))
    train_step(model, 1)
    return model, good


def _generators() -> tuple:
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


def _same_generators(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def _bad_numpy_rng() -> dict:
    state = capture_rng_state()
    state["numpy"]["keys"] = state["numpy"]["keys"][:10]  # a valid pickle, a generator numpy refuses
    return state


def _bad_torch_rng() -> dict:
    state = capture_rng_state()
    state["torch"] = torch.zeros(7, dtype=torch.uint8)
    return state


@pytest.mark.parametrize("file,content,match", [
    ("rng_state.pt", _bad_numpy_rng, "rng_state.pt.* is malformed"),
    ("rng_state.pt", _bad_torch_rng, "rng_state.pt.* is malformed"),
    ("scheduler.pt", lambda: {"last_epoch": "soon"}, "scheduler.pt.* does not fit"),
    ("scheduler.pt", lambda: [1, 2, 3], "scheduler.pt.* holds list"),
    ("optimizer.pt", lambda: {"state": {}, "param_groups": [{"lr": 1.0}]}, "optimizer.pt"),
])
def test_a_malformed_side_file_changes_nothing(saved, tmp_path, file, content, match) -> None:
    model, good = saved
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    torch_save(content(), broken / file)
    before, generators = model_state_hash(model), _generators()
    with pytest.raises(CheckpointError, match=match):
        model.resume_from_checkpoint(str(broken))
    assert model_state_hash(model) == before  # weights, optimizer, scheduler, progress
    assert _same_generators(_generators(), generators)


def test_the_good_checkpoint_still_resumes(saved) -> None:
    model, good = saved
    progress = model.resume_from_checkpoint(str(good))
    assert progress["cur_step"] == 1
