"""A step with an inf/NaN loss, an inf/NaN gradient norm or an fp16 overflow is skipped.

Skipped means: no weight, optimizer-state, ``cur_step`` or lr-scheduler change; the gradients are
dropped; the metrics count it (``skipped_steps``) and a warning names the step. After
``max_consecutive_skips`` skips in a row training stops with an error naming the step. The
reference for "nothing changed" is a second model that never saw the bad window.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hf_testing import make_batch, make_model, tensor_hash
from torch.optim.lr_scheduler import StepLR

from twinkle.model.optimizer_group import TooManySkippedStepsError


class _Poison:
    """A per-batch-mean cross entropy that can be made inf/NaN (``bad='loss'``) or to have NaN gradients only."""

    def __init__(self) -> None:
        self.bad: str | None = None

    def __call__(self, inputs, outputs):
        logits = outputs.logits.float()[:, :-1]
        labels = inputs["labels"][:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100)
        if self.bad == "loss":
            return loss * float("nan")
        if self.bad == "grad":  # finite value (loss + 0), NaN gradient: d sqrt(|x|)/dx at 0
            return loss + (logits.sum() * 0).abs().sqrt()
        return loss


def _model(seed: int = 0, **kwargs):
    model = make_model(seed=seed, **kwargs)
    model.set_optimizer("AdamW", lr=1e-2)
    model.set_lr_scheduler(StepLR, step_size=1, gamma=0.5)
    poison = _Poison()
    model.set_loss(poison)
    return model, poison


def _snapshot(model) -> tuple[str, str, float, int]:
    group = model.optimizer_group["default"]
    return (tensor_hash(model.get_state_dict()), tensor_hash(group.optimizer.state_dict()),
            group.optimizer.param_groups[0]["lr"], group.cur_step)


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_a_non_finite_window_is_skipped_and_leaves_no_trace(bad: str, caplog) -> None:
    model, poison = _model()
    reference, _ = _model()
    for m in (model, reference):
        m.forward_backward(inputs=make_batch(1))
        m.clip_grad_and_step()
    before = _snapshot(model)
    assert before == _snapshot(reference)

    poison.bad = bad
    with caplog.at_level(logging.WARNING, logger="twinkle"):
        model.forward_backward(inputs=make_batch(2))
        model.clip_grad_and_step()
    assert _snapshot(model) == before  # weights, AdamW moments, lr and cur_step unchanged
    metrics = model.calculate_metric(is_training=True)
    assert metrics["skipped_steps"] == 1 and metrics["step"] == 1
    reason = "the loss is inf/NaN" if bad == "loss" else "the gradient norm is nan"
    assert f"Skipped step 2 of group 'default': {reason}" in caplog.text

    poison.bad = None  # the next window trains exactly as if the bad one never happened
    for m in (model, reference):
        m.forward_backward(inputs=make_batch(3))
        m.clip_grad_and_step()
    assert _snapshot(model) == _snapshot(reference)
    assert model.calculate_metric(is_training=True)["skipped_steps"] == 1
    assert model.optimizer_group["default"].consecutive_skips == 0


def test_without_clipping_a_nan_loss_is_still_skipped() -> None:
    model, poison = _model()
    before = _snapshot(model)
    poison.bad = "loss"
    model.forward_backward(inputs=make_batch(2))
    model.clip_grad_and_step(max_grad_norm=None)
    assert _snapshot(model) == before


def test_consecutive_skips_stop_training_naming_the_step() -> None:
    model, poison = _model()
    model.forward_backward(inputs=make_batch(1))
    model.clip_grad_and_step()
    poison.bad = "loss"
    for _ in range(2):
        model.forward_backward(inputs=make_batch(2))
        model.clip_grad_and_step(max_consecutive_skips=3)
    model.forward_backward(inputs=make_batch(2))
    with pytest.raises(TooManySkippedStepsError, match=r"Training stopped at step 2 of group 'default': 3 optimizer "
                                                        r"steps in a row were skipped .*max_consecutive_skips="):
        model.clip_grad_and_step(max_consecutive_skips=3)
    assert model.optimizer_group["default"].cur_step == 1


def test_max_consecutive_skips_must_be_a_positive_int() -> None:
    model, _ = _model()
    with pytest.raises(ValueError, match="max_consecutive_skips must be an integer >= 1.*got 0"):
        model.clip_grad_and_step(max_consecutive_skips=0)


def test_an_fp16_overflow_advances_neither_step_nor_scheduler() -> None:
    model = make_model(seed=2, mixed_precision="fp16", grad_scaler_config={"init_scale": 2.0**40})
    model.set_optimizer("SGD", lr=0.1)
    model.set_lr_scheduler(StepLR, step_size=1, gamma=0.5)
    group = model.optimizer_group["default"]
    before = tensor_hash(model.get_state_dict())
    for clip in (1.0, None):  # detected through the gradient norm, or by the scaler itself
        model.forward_backward(inputs=make_batch(1))
        model.clip_grad_and_step(max_grad_norm=clip)
    assert tensor_hash(model.get_state_dict()) == before
    assert group.cur_step == 0 and group.optimizer.param_groups[0]["lr"] == 0.1
    assert group.scaler.get_scale() == 2.0**38  # backed off once per skipped step
    assert model.calculate_metric(is_training=True)["skipped_steps"] == 2
