"""Applying a group's loss to a forward's inputs and outputs, the same way in every backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.model.optimizer_group import OptimizerGroup


def require_forward(group: OptimizerGroup, outputs: Any) -> None:
    """A loss needs the outputs of a forward: say so when there are none."""
    if outputs is None:
        raise RuntimeError(f"calculate_loss(adapter_name={group.name!r}) needs a forward first "
                           "(forward(inputs=...) or forward_only(inputs=...)).")


def compute_loss(group: OptimizerGroup, inputs: Mapping[str, Any], outputs: Any, kwargs: Mapping[str, Any],
                 is_training: bool, default: Callable[[], Any] = CrossEntropyLoss) -> tuple[torch.Tensor, Any]:
    """``(loss sum as a 0-dim tensor, items)`` of the group's loss (``default()`` when it has none).

    A twinkle :class:`Loss` gives its sum and item count; a plain callable returns a per-batch
    mean, so every micro-batch weighs the same (items = 1). A loss that counts correct tokens
    itself (the fused CE path never materialises logits) feeds the group's accuracy metrics.
    """
    require_forward(group, outputs)
    loss_fn = group.loss if group.loss is not None else default()
    if isinstance(loss_fn, Loss):
        total, items = loss_fn.compute(inputs, outputs, **kwargs)
    else:
        total, items = loss_fn(inputs, outputs, **kwargs), 1
    if not isinstance(total, torch.Tensor) or total.numel() != 1:
        raise TypeError(f"The loss {type(loss_fn).__name__} of group {group.name!r} returned "
                        f"{type(total).__name__}; a loss must return a scalar tensor.")
    counts = getattr(loss_fn, "last_token_counts", None)
    if counts is not None:
        for metric in group.metrics(is_training):
            if hasattr(metric, "update_counts"):
                metric.update_counts(*counts)
    return total.reshape(()), items
