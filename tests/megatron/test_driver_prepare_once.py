"""MegatronDriver prepares the gradients once per step (issue 22, defect 1).

megatron-core's ``prepare_grads`` copies the model gradients to the main gradients, unscales them,
checks them for inf/NaN (an all-reduce) and updates the fp16 loss scale. The driver used to call it in
``clip`` and then ``optimizer.step()``, which calls it again: two loss-scale updates per step, the
gradients copied and unscaled a second time (by the *updated* scale), the norm all-reduced twice.

These tests drive megatron-core 0.16's own ``MixedPrecisionOptimizer`` control flow (``step``,
``prepare_grads``, ``step_with_ready_grads``, ``DynamicGradScaler``, ``get_grad_norm_fp32``,
``clip_grad_by_total_norm_fp32``) on CPU: only the storage hooks a concrete megatron optimizer
implements are stubbed, ``device='cuda'`` allocations go to the CPU and ``torch.distributed.all_reduce``
is a single-rank counter.
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from megatron.core.optimizer.grad_scaler import DynamicGradScaler  # noqa: E402
from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer  # noqa: E402

from twinkle_megatron.model.drivers import MegatronDriver  # noqa: E402

SCALE = 1024.0


@pytest.fixture
def reductions(monkeypatch):
    """CUDA allocations on the CPU, CPU tensors pass megatron's CUDA type check; all-reduces counted (one rank)."""

    def cpu_device(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)

        return wrapper

    for name in ("tensor", "zeros", "empty", "ones", "full"):
        monkeypatch.setattr(torch, name, cpu_device(getattr(torch, name)))
    plain_type = torch.Tensor.type
    monkeypatch.setattr(torch.Tensor, "type", lambda self, *a, **k: plain_type(self, *a, **k).replace(
        "torch.", "torch.cuda.", 1) if not a and not k else plain_type(self, *a, **k))
    calls = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None, group=None, **_: calls.append(op))
    return calls


class CountingScaler(DynamicGradScaler):
    """megatron's dynamic scaler (grows after every clean step, backs off after every overflow), counting updates."""

    def __init__(self) -> None:
        super().__init__(initial_scale=SCALE, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                         growth_interval=1, hysteresis=1)
        self.updates = 0

    def update(self, found_inf: bool) -> None:
        self.updates += 1
        super().update(found_inf)


class MockMegatronOptimizer(MixedPrecisionOptimizer):
    """megatron-core's MixedPrecisionOptimizer with its storage hooks stubbed: one fp32 main copy per gradient."""

    def __init__(self, model_grads: list[torch.Tensor]) -> None:
        self.main = [torch.nn.Parameter(torch.zeros_like(g)) for g in model_grads]
        self.model_grads = model_grads  # what backward left in the model's (scaled) gradient buffers
        config = OptimizerConfig(optimizer="sgd", lr=1.0, fp16=True, clip_grad=0.0)
        super().__init__(torch.optim.SGD(self.main, lr=1.0), config, CountingScaler(), lambda _: None)
        self.grad_stats_parallel_group = None
        self.is_stub_optimizer = False  # set by the concrete megatron optimizers
        self.prepared = 0

    def prepare_grads(self) -> bool:
        self.prepared += 1
        return super().prepare_grads()

    def _copy_model_grads_to_main_grads(self) -> None:
        for main, grad in zip(self.main, self.model_grads):
            main.grad = grad.clone()

    def _collect_main_grad_data_for_unscaling(self) -> list[torch.Tensor]:
        return [p.grad for p in self.main]

    def _copy_main_params_to_model_params(self) -> None:
        pass

    def get_main_grads_for_grad_norm(self) -> list[torch.Tensor]:
        return [p.grad for p in self.main]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.main:
            p.grad = None

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict) -> None:
        pass

    def sharded_state_dict(self, *args, **kwargs):
        return {}


class _Chunk:
    def zero_grad_buffer(self) -> None:
        pass


def driver(grads: list[torch.Tensor]) -> MegatronDriver:
    return MegatronDriver(MockMegatronOptimizer([g * SCALE for g in grads]), [_Chunk()], [])


def test_clip_and_step_prepare_once_and_reduce_the_norm_once(reductions):
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]  # norm 5
    d = driver(grads)
    norm = d.clip(1.0, 2)
    assert d.step() is True
    d.zero_grad()
    opt = d.optimizer
    assert opt.prepared == 1
    assert opt.grad_scaler.updates == 1
    assert float(opt.get_loss_scale()) == SCALE * 2  # one clean step grows the scale once
    assert norm == pytest.approx(5.0)  # sqrt(3**2 + 4**2): exact in float32; approx only for the type
    # one inf/NaN check (MAX) and one norm reduction (SUM)
    assert reductions == [torch.distributed.ReduceOp.MAX, torch.distributed.ReduceOp.SUM]
    # SGD(lr=1) applied the unscaled gradient clipped to norm 1
    # clip scale 1/5, unscale, lr 1: three float32 roundings of values <= 1 (3 u = 2e-7), far inside 1e-5
    assert torch.allclose(opt.main[0].detach(), torch.tensor([-0.6, 0.0]), atol=1e-5)
    assert torch.allclose(opt.main[1].detach(), torch.tensor([[-0.8]]), atol=1e-5)


def test_step_without_clip_prepares_once_and_does_not_clip(reductions):
    d = driver([torch.tensor([3.0, 4.0])])
    assert d.step() is True
    opt = d.optimizer
    assert (opt.prepared, opt.grad_scaler.updates) == (1, 1)
    assert reductions == [torch.distributed.ReduceOp.MAX]
    assert torch.equal(opt.main[0].detach(), torch.tensor([-3.0, -4.0]))  # lr 1 times integers: exact


def test_an_overflow_backs_the_scale_off_once_and_skips_the_step(reductions):
    d = driver([torch.tensor([float("inf"), 1.0])])
    assert d.clip(1.0, 2) is None
    assert d.step() is False
    d.zero_grad()
    opt = d.optimizer
    assert (opt.prepared, opt.grad_scaler.updates) == (1, 1)
    assert float(opt.get_loss_scale()) == SCALE / 2
    assert torch.equal(opt.main[0].detach(), torch.zeros(2))


def test_every_step_prepares_afresh(reductions):
    d = driver([torch.tensor([1.0])])
    for _ in range(3):
        d.clip(10.0, 2)
        d.step()
        d.zero_grad()
    assert (d.optimizer.prepared, d.optimizer.grad_scaler.updates) == (3, 3)
    assert float(d.optimizer.get_loss_scale()) == SCALE * 8


def test_a_new_window_is_prepared_even_if_the_last_one_was_never_stepped(reductions, monkeypatch):
    """A skipped step (inf/NaN loss) may leave no step() and no zero_grad() before the next window's finalize."""
    import megatron.core.distributed

    monkeypatch.setattr(megatron.core.distributed, "finalize_model_grads", lambda chunks, num_tokens: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    d = driver([torch.tensor([1.0])])
    d.chunks[0].module = torch.nn.Linear(1, 1)
    d.clip(1.0, 2)  # prepared; the step is then skipped before the optimizer runs
    d.finalize(4)
    d.clip(1.0, 2)
    assert d.step() is True and d.optimizer.prepared == 2
