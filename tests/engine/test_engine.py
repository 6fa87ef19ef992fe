"""The engine drives any object with the Backend members (no base class): a 40-line backend over a linear
regression gets gradient accumulation, the non-finite skip and clipping exactly as the HF and Megatron
backends do. The reference is plain torch on the same numbers."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from rounding import U, chain_bound, within

from twinkle.engine import Engine, Route
from twinkle.loss.base import Loss
from twinkle.model.optimizer_group import OptimizerGroup


class SquaredError(Loss):
    """Sum of squared errors over every target value; its items are the values."""

    def compute(self, inputs, outputs, **kwargs):
        diff = outputs["logits"] - inputs["y"]
        return (diff * diff).sum(), diff.numel()


class LinearBackend:
    """What the engine needs of a backend, for ``y = W x``."""

    sums_losses = False
    grad_multiplier = None
    schedules = False

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.module = torch.nn.Linear(3, 2, bias=False)

    def parameters(self, group):
        return list(self.module.parameters())

    def prepare(self, batch, group, task, options):
        return [dict(batch)]

    def routed(self, routes):
        return contextlib.nullcontext()

    def run(self, task, batch, training, options):
        return {"logits": self.module(batch["x"])}

    def reference_logprobs(self, routes, batch):  # pragma: no cover - no reference loss here
        raise NotImplementedError

    def loss_for(self, group, task, consumable):
        return group.loss

    def data_sum(self, total, items):
        return total.detach(), items

    def grad_sync(self, on):
        pass

    def scale_loss(self, group, loss):
        return loss

    def finish_grads(self, group):
        factor = group.grad_rescale()
        if factor is not None:
            for p in self.parameters(group):
                p.grad.mul_(factor)

    def clip(self, group, max_norm, norm_type):
        return float(torch.nn.utils.clip_grad_norm_(self.parameters(group), max_norm, norm_type))

    def apply_step(self, group):
        group.optimizer.step()
        return True

    def skip_update(self, group):
        pass

    def agree(self, flags):
        return flags


def _setup(accumulation: int = 1) -> tuple[Engine, OptimizerGroup, LinearBackend]:
    backend = LinearBackend()
    group = OptimizerGroup("default", gradient_accumulation_steps=accumulation, loss=SquaredError())
    group.optimizer = torch.optim.SGD(backend.parameters(group), lr=0.1)
    return Engine(backend), group, backend


def _batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(rows, 3, generator=gen), "y": torch.randn(rows, 2, generator=gen)}


def test_two_accumulated_micro_batches_step_as_one_token_weighted_batch() -> None:
    engine, group, backend = _setup(accumulation=2)
    first, second = _batch(1, 1), _batch(3, 2)  # different sizes: the mean must weigh values, not batches
    for batch in (first, second):
        engine.forward_backward([Route(group)], [batch], "regression", {})
        engine.clip_grad_and_step(group, max_grad_norm=None, norm_type=2)

    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2, bias=False)
    x, y = torch.cat([first["x"], second["x"]]), torch.cat([first["y"], second["y"]])
    ((reference(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        reference.weight -= 0.1 * reference.weight.grad
    # the same float32 sums grouped otherwise: 3-term products, a mean over 4 values, 2 micro-batches added
    # (tests/rounding.py), elementwise by within() over the 3 inputs
    torch.testing.assert_close(backend.module.weight, reference.weight,
                               **within(chain_bound(3, 4, 2), reference.weight, terms=3))
    assert group.cur_step == 1 and group.micro_step == 0


def test_a_non_finite_loss_skips_the_step_and_changes_nothing() -> None:
    engine, group, backend = _setup()
    before = backend.module.weight.detach().clone()
    bad = _batch(2, 3)
    bad["y"][0, 0] = math.inf
    losses = engine.forward_backward([Route(group)], [bad], "regression", {})
    assert not math.isfinite(float(losses["default"]))
    engine.clip_grad_and_step(group, max_grad_norm=1.0, norm_type=2)
    assert torch.equal(backend.module.weight, before)
    assert (group.cur_step, group.skipped_steps) == (0, 1)
    assert all(p.grad is None for p in backend.parameters(group))  # the bad gradients were dropped


def test_clipping_reports_the_norm_before_clipping() -> None:
    engine, group, backend = _setup()
    batch = _batch(4, 5)
    engine.forward_backward([Route(group)], [batch], "regression", {})
    expected = torch.nn.utils.get_total_norm([p.grad for p in backend.parameters(group)])
    norm = engine.clip_grad_norm(group, 1e-3, 2)
    assert norm == pytest.approx(float(expected), rel=chain_bound(6))  # 6 squares summed in another grouping
    # clip_grad_norm_ scales by max_norm / (norm + 1e-6) in float32 (an addition, a division, a product: 3 u)
    # and the norm is summed again (6 squares, a square root: chain_bound(6) + u); unclipped it would be ~norm
    clipped = float(torch.nn.utils.get_total_norm([p.grad for p in backend.parameters(group)]))
    assert clipped == pytest.approx(1e-3 * norm / (norm + 1e-6), rel=chain_bound(6) + 4 * U, abs=0)
    assert norm > 10 * 1e-3  # the clip changed the gradients far beyond that room
