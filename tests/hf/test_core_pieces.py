"""The backend-neutral pieces in core that TransformersModel builds on (and Megatron will reuse)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from twinkle.checkpoint import (
    CheckpointError,
    atomic_directory,
    capture_rng_state,
    checkpoint_path,
    restore_rng_state,
    safe_torch_load,
    torch_save,
)
from twinkle.metric import LossMetric, TokenAccuracy
from twinkle.model.optimizer_group import OptimizerGroup


def test_atomic_directory_replaces_or_leaves_untouched(tmp_path) -> None:
    final = tmp_path / "ck"
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("two")
            raise RuntimeError("crash")
    assert (final / "a.txt").read_text() == "one" and [p.name for p in tmp_path.iterdir()] == ["ck"]
    with atomic_directory(final) as tmp:
        (tmp / "b.txt").write_text("three")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"] and [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_checkpoint_path_accepts_nested_names_only_below_output_dir(tmp_path) -> None:
    assert checkpoint_path("run1/checkpoint-5", tmp_path) == tmp_path / "run1" / "checkpoint-5"
    for bad in ("../x", "x/../../y", "/abs", "~/x", ""):
        with pytest.raises(CheckpointError):
            checkpoint_path(bad, tmp_path)


def test_rng_state_round_trip_through_weights_only_load(tmp_path) -> None:
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    torch_save(capture_rng_state(), tmp_path / "rng.pt")
    first = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    restore_rng_state(safe_torch_load(tmp_path / "rng.pt"))
    second = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], second[0]) and first[1:] == second[1:]
    with pytest.raises(CheckpointError, match="malformed"):
        restore_rng_state({"python": [3, [1, 2], None]})


def test_optimizer_group_accumulation_bookkeeping() -> None:
    group = OptimizerGroup("g", gradient_accumulation_steps=3)
    divisors = []
    for items in (10, 30, 20):
        divisors.append(group.backward_divisor(items))
        group.record_backward(items)
    assert divisors == [10, 10, 10] and group.is_boundary
    assert group.grad_rescale() == pytest.approx(10 / 60)  # a ratio of integers in double: a rounding or two
    group.finish_step()
    assert group.cur_step == 1 and group.zero_grad_due and group.lr_step_pending and not group.is_boundary
    group.finish_zero_grad()
    assert not group.zero_grad_due
    group.backward_divisor(torch.tensor(0))  # a micro-batch with no trained token
    group.record_backward(torch.tensor(0))
    assert group.window_ref_items == 1
    single = OptimizerGroup("s")
    single.backward_divisor(7)
    single.record_backward(7)
    assert single.grad_rescale() is None  # one micro-batch: nothing to rescale
    with pytest.raises(ValueError, match="got 0"):
        OptimizerGroup("bad", gradient_accumulation_steps=0)


def test_loss_metric_is_token_weighted_and_accuracy_counts_trained_tokens() -> None:
    metric = LossMetric()
    metric.update_loss(torch.tensor(10.0), 5)   # mean 2 over 5 tokens
    metric.update_loss(torch.tensor(4.0), torch.tensor(1))  # mean 4 over 1 token
    assert metric.compute() == {"loss": pytest.approx(14 / 6)}  # float32 sums of integers, one division: 6e-8
    metric.reset()
    assert metric.compute() == {}
    accuracy = TokenAccuracy()
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 1] = logits[0, 1, 3] = logits[0, 2, 0] = 1.0  # predicts 1, 3, 0 for labels[1:]
    accuracy.update({"labels": torch.tensor([[-100, 1, 2, -100]])}, {"logits": logits})
    assert accuracy.compute() == {"token_accuracy": 0.5}
