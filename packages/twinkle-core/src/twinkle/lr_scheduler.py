"""Warm-up schedulers, counted in optimizer steps (the scheduler only advances on a step boundary)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _check_steps(num_warmup_steps: int, num_training_steps: int) -> None:
    if num_training_steps < 1:
        raise ValueError(f"num_training_steps must be >= 1, got {num_training_steps}.")
    if not 0 <= num_warmup_steps <= num_training_steps:
        raise ValueError(
            f"num_warmup_steps must be between 0 and num_training_steps={num_training_steps}, got {num_warmup_steps}."
        )


def _warmup_then(num_warmup_steps: int, num_training_steps: int, min_lr_ratio: float,
                 decay: Callable[[int], float]) -> Callable[[int], float]:
    """The lr factor of a step: linear warm-up to 1, then ``decay(step)`` (1 -> 0) mapped onto [min_lr_ratio, 1]."""
    _check_steps(num_warmup_steps, num_training_steps)

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay(step)

    return factor


class CosineWarmupScheduler(LambdaLR):
    """Linear warm-up to the base lr, then cosine decay to ``min_lr_ratio * base lr``."""

    def __init__(
        self,
        optimizer: Optimizer,
        num_warmup_steps: int,
        num_training_steps: int,
        num_cycles: float = 0.5,
        min_lr_ratio: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        def cosine(step: int) -> float:
            # clamped: steps past the end stay at the floor instead of climbing back up the cosine
            progress = min(1.0, (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))

        super().__init__(optimizer, _warmup_then(num_warmup_steps, num_training_steps, min_lr_ratio, cosine),
                         last_epoch)


class LinearWarmupScheduler(LambdaLR):
    """Linear warm-up to the base lr, then linear decay to ``min_lr_ratio * base lr``."""

    def __init__(
        self,
        optimizer: Optimizer,
        num_warmup_steps: int,
        num_training_steps: int,
        min_lr_ratio: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        def remaining(step: int) -> float:
            return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

        super().__init__(optimizer, _warmup_then(num_warmup_steps, num_training_steps, min_lr_ratio, remaining),
                         last_epoch)
