"""The warm-up schedulers against transformers' reference implementations."""

from __future__ import annotations

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from twinkle.registry import resolve

#: Both sides compute each lr in float64 Python arithmetic (a division, a cosine, a few products, each within
#: 2**-53 = 1.1e-16 relative): they may group it otherwise, < 1e-15 apart; 1e-12 leaves room. A step off or a
#: wrong formula moves an lr by more than 1e-2 relative (consecutive steps of these schedules differ that much).
REL = 1e-12


def lrs(scheduler_factory, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = scheduler_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("warmup, total", [(0, 10), (3, 10), (10, 10)])
def test_cosine_and_linear_match_transformers(warmup, total):
    cosine = resolve("lr_scheduler", "CosineWarmupScheduler")
    linear = resolve("lr_scheduler", "LinearWarmupScheduler")
    assert lrs(lambda o: cosine(o, warmup, total), total + 1) == pytest.approx(
        lrs(lambda o: get_cosine_schedule_with_warmup(o, warmup, total), total + 1), rel=REL, abs=0)
    assert lrs(lambda o: linear(o, warmup, total), total + 2) == pytest.approx(
        lrs(lambda o: get_linear_schedule_with_warmup(o, warmup, total), total + 2), rel=REL, abs=0)


def test_min_lr_ratio_and_bad_steps():
    cosine = resolve("lr_scheduler", "CosineWarmupScheduler")
    tail = lrs(lambda o: cosine(o, 0, 4, min_lr_ratio=0.1), 8)[4:]
    assert tail == pytest.approx([0.05] * 4, rel=REL, abs=0)  # the floor is reached at the last step and kept after it
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    with pytest.raises(ValueError, match="num_warmup_steps must be between 0 and num_training_steps=4, got 5"):
        cosine(opt, 5, 4)
    with pytest.raises(ValueError, match="num_training_steps must be >= 1, got 0"):
        cosine(opt, 0, 0)
