"""The Metric base class and the two metrics every group starts with: the loss and token accuracy.

A model feeds each metric of a group with every forward (:meth:`Metric.update`) and every computed
loss (:meth:`Metric.update_loss`). Updates keep device tensors (no ``.item()``) so a training step
never waits on the device for a metric; the one host sync happens in :meth:`Metric.compute`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.constants import IGNORE_INDEX


class Metric:
    """Accumulates over batches; ``compute`` returns ``{name: float}``; ``reset`` starts over.

    Updates should keep device tensors (no ``.item()``) so a training step never waits on the
    device for a metric; the one host sync happens in :meth:`compute`.
    """

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        """Called after every forward with the model inputs and outputs."""

    def update_loss(self, loss_sum: Any, num_items: Any) -> None:
        """Called after every loss computation with the loss sum and the items it covers (int or tensor)."""

    def compute(self) -> dict[str, float]:
        """The accumulated values as plain numbers (empty when nothing was accumulated)."""
        return {}

    def reset(self) -> None:
        """Forget everything accumulated."""


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


def _logits(outputs: Any) -> Any:
    if isinstance(outputs, Mapping):
        return outputs.get("logits")
    return getattr(outputs, "logits", None)


class TokenAccuracy(Metric):
    """Share of trained tokens whose arg-max prediction equals the label.

    Batches without logits or labels (an embedding forward, say) are skipped. Outputs with a
    ``token_matches(inputs, ignore_index)`` method give the counts themselves (Megatron's
    vocabulary-parallel logits: no rank holds the whole vocabulary's arg-max).
    """

    def __init__(self, name: str = "token_accuracy", ignore_index: int = IGNORE_INDEX) -> None:
        self.name = name
        self.ignore_index = ignore_index
        self.reset()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        matches = getattr(outputs, "token_matches", None)
        if matches is not None:  # outputs that count their arg-max themselves (vocabulary-parallel logits)
            counts = matches(inputs, self.ignore_index)
            if counts is not None:
                self.update_counts(*counts)
            return
        logits = _logits(outputs)
        labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
        if logits is None or labels is None or logits.dim() < 2:
            return
        labels = labels.to(logits.device)[..., 1:]
        predictions = logits.detach().argmax(dim=-1)[..., :-1]
        mask = labels != self.ignore_index
        self.update_counts(((predictions == labels) & mask).sum(), mask.sum())

    def update_counts(self, correct: Any, total: Any) -> None:
        """Add counts a loss computed itself (the fused CE path never materialises logits)."""
        self._correct = correct if self._correct is None else self._correct + correct
        self._total = total if self._total is None else self._total + total

    def compute(self) -> dict[str, float]:
        from twinkle import collective  # imports torch: not at module load (the CLI runs without it)

        correct, total = collective.sum_floats([self._correct or 0, self._total or 0], collective.data_group())
        if total == 0:
            return {}
        return {self.name: correct / total}

    def reset(self) -> None:
        self._correct: Any = None
        self._total: Any = None
