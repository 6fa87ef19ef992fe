"""The Metric base class: cheap per-batch updates, one host sync at compute()."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
