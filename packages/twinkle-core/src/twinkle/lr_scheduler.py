"""Warm-up schedulers, counted in optimizer steps (the scheduler only advances on a step boundary)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _check_steps(num_warmup_steps: int, num_training_steps: int) -> None:
    if num_training_steps < 1:
        raise ValueError(f"num_training_steps must be >= 1, got {num_training_steps}.")
    if not 0 <= num_warmup_steps <= num_training_steps:
        raise ValueError(
            f"num_warmup_steps must be between 0 and num_training_steps={num_training_steps}, got {num_warmup_steps}."
        )


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
        _check_steps(num_warmup_steps, num_training_steps)

        def factor(step: int) -> float:
            if step < num_warmup_steps:
                return step / max(1, num_warmup_steps)
            # clamped: steps past the end stay at the floor instead of climbing back up the cosine
            progress = min(1.0, (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps))
            cosine = max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
            return min_lr_ratio + (1.0 - min_lr_ratio) * cosine

        super().__init__(optimizer, factor, last_epoch)


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
        _check_steps(num_warmup_steps, num_training_steps)

        def factor(step: int) -> float:
            if step < num_warmup_steps:
                return step / max(1, num_warmup_steps)
            remaining = max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))
            return min_lr_ratio + (1.0 - min_lr_ratio) * remaining

        super().__init__(optimizer, factor, last_epoch)
