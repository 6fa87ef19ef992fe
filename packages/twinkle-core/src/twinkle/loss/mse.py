"""Mean squared error between a model's outputs and regression targets (reward or value heads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss, output_field


class MSELoss(Loss):
    """``mean((outputs[prediction] - inputs['labels']) ** 2)`` over every element.

    Args:
        reduction: ``'mean'`` over the elements or their ``'sum'``.
        prediction: the output field holding the predictions (``'logits'``, as upstream Twinkle).
    """

    def __init__(self, reduction: str = "mean", prediction: str = "logits") -> None:
        super().__init__(reduction)
        self.prediction = prediction

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, int]:
        if "labels" not in inputs:
            raise KeyError("MSELoss needs 'labels' in the inputs: the regression targets.")
        predictions = output_field(outputs, self.prediction)
        targets = torch.as_tensor(inputs["labels"]).to(predictions.device)
        if targets.shape != predictions.shape:
            raise ValueError(f"MSELoss: outputs[{self.prediction!r}] has shape {tuple(predictions.shape)} but the "
                             f"labels {tuple(targets.shape)}; give one target per prediction.")
        diff = predictions.float() - targets.float()
        return (diff * diff).sum(), diff.numel()
