"""Losses: a Loss maps (model inputs, model outputs) to a scalar tensor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class Loss(ABC):
    """Base class of twinkle losses. ``reduction='sum'`` lets the caller weight by token count."""

    def __init__(self, reduction: str = "mean") -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
        self.reduction = reduction

    @abstractmethod
    def __call__(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> torch.Tensor:
        """The loss of one batch: ``inputs`` as fed to the model, ``outputs`` as it returned them."""


class CrossEntropyLoss(Loss):
    """Next-token cross-entropy: logits at position t predict ``labels[t + 1]``; -100 is ignored."""

    def __init__(self, reduction: str = "mean", ignore_index: int = IGNORE_INDEX) -> None:
        super().__init__(reduction)
        self.ignore_index = ignore_index

    def __call__(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs.logits
        if "labels" not in inputs:
            raise KeyError("CrossEntropyLoss needs 'labels' in the inputs (encode the dataset with a template).")
        labels = inputs["labels"].to(logits.device)
        shift_logits = logits[..., :-1, :].reshape(-1, logits.shape[-1]).float()
        shift_labels = labels[..., 1:].reshape(-1)
        return F.cross_entropy(shift_logits, shift_labels, ignore_index=self.ignore_index, reduction=self.reduction)
