"""Upstream Twinkle's TrainMetric: learning rate, iterations and speed of the training loop."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.metric.builtin import Metric


class TrainMetric(Metric):
    """``learning rate`` (one per param group), ``iters`` (optimizer steps) and ``speed`` (steps/s).

    Fed by :meth:`accumulate` with ``lr=``, ``step=`` (micro-batches so far) and
    ``gradient_accumulation_steps=``; the speed is over the steps since the last :meth:`reset`.

    Args:
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, device_mesh: Any = None, process_group: Any = None, **kwargs: Any) -> None:
        self.device_mesh, self.process_group = device_mesh, process_group
        self.lr: float | list[float] | None = None
        self.step: int | None = None
        self.last_step = 0
        self.gradient_accumulation_steps = 1
        self.start_time = self._since = time.monotonic()

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, *,
                   lr: float | Sequence[float] | None = None, step: int | None = None,
                   gradient_accumulation_steps: int | None = None, **kwargs: Any) -> None:
        """Record the current learning rate(s) and step."""
        if lr is not None:
            self.lr = [float(x) for x in lr] if isinstance(lr, Sequence) else float(lr)
        if step is not None:
            self.step = int(step)
        if gradient_accumulation_steps is not None:
            self.gradient_accumulation_steps = max(1, int(gradient_accumulation_steps))

    def compute(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        lrs = self.lr if isinstance(self.lr, list) else None if self.lr is None else [self.lr]
        if lrs and len(lrs) == 1:
            out["learning rate"] = lrs[0]
        elif lrs:
            out.update({f"learning rate(param group {i + 1})": v for i, v in enumerate(lrs)})
        if self.step is not None:
            out["iters"] = self.step // self.gradient_accumulation_steps
            elapsed = max(time.monotonic() - self._since, 1e-9)
            out["speed"] = (self.step - self.last_step) / self.gradient_accumulation_steps / elapsed
            out["total time elapse"] = time.monotonic() - self.start_time
        return out

    def reset(self) -> None:
        self._since = time.monotonic()
        self.last_step = self.step or 0
