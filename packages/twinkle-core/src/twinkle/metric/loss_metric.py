"""The loss averaged over every item (token) seen since the last reset."""

from __future__ import annotations

from typing import Any

from twinkle.metric.base import Metric


class LossMetric(Metric):
    """Token-weighted mean loss: sum of loss sums / sum of items, reported as ``loss``."""

    def __init__(self, name: str = "loss") -> None:
        self.name = name
        self.reset()

    def update_loss(self, loss_sum: Any, num_items: Any) -> None:
        value = loss_sum.detach() if hasattr(loss_sum, "detach") else loss_sum
        self._sum = value if self._sum is None else self._sum + value
        self._items = self._items + num_items

    def compute(self) -> dict[str, float]:
        from twinkle import collective  # imports torch: not at module load (the CLI runs without it)

        total, items, seen = collective.sum_floats([0.0 if self._sum is None else self._sum, self._items,
                                                    0.0 if self._sum is None else 1.0], collective.data_group())
        if not seen:
            return {}
        return {self.name: total / max(items, 1.0)}

    def reset(self) -> None:
        self._sum: Any = None
        self._items = 0
