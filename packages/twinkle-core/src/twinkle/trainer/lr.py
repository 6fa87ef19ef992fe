"""``build_lr_scheduler``: an :class:`LRConfig` (our registered scheduler, or xtuner's lr_type / warmup_ratio /
lr_min) as a torch ``LRScheduler`` on one optimizer."""

from __future__ import annotations

from typing import Any


def build_scheduler(lr_cfg: Any, optimizer: Any, lr: float, scheduler_step: int) -> Any:
    """The schedule of ``lr_cfg`` over ``scheduler_step`` optimizer steps, bound to ``optimizer`` (peak ``lr``).

    xtuner's ``cosine`` / ``linear`` are twinkle's CosineWarmupScheduler / LinearWarmupScheduler (linear warm-up
    from 0, then decay to ``lr_min``); ``constant`` (and ``scheduler: none`` with a warm-up) is the warm-up then
    the peak lr.
    """
    from torch.optim.lr_scheduler import LambdaLR

    from twinkle.model.components import build_component
    from twinkle.registry import resolve

    name, kwargs = lr_cfg.schedule(lr, scheduler_step)
    if name is None:
        warmup = int(kwargs.get("num_warmup_steps", 0))
        return LambdaLR(optimizer, _WarmupThenConstant(warmup))
    return build_component("lr_scheduler", resolve("lr_scheduler", name), kwargs, optimizer)


class _WarmupThenConstant:
    """lr factor: ``step / warmup`` during the warm-up, then 1 (a class, so the scheduler's state pickles)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        return step / self.warmup if step < self.warmup else 1.0
