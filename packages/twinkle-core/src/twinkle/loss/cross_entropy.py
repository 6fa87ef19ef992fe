"""Next-token cross-entropy over the labels a template produced (-100 marks untrained tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX
from twinkle.loss.base import Loss, output_field


class CrossEntropyLoss(Loss):
    """Logits at position t predict ``labels[t + 1]``; ``ignore_index`` positions are skipped.

    The mean is over trained tokens, so accumulating micro-batches by their token counts gives
    exactly the loss of the concatenated batch.
    """

    def __init__(self, reduction: str = "mean", ignore_index: int = IGNORE_INDEX) -> None:
        super().__init__(reduction)
        self.ignore_index = ignore_index

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if "labels" not in inputs:
            raise KeyError("CrossEntropyLoss needs 'labels' in the inputs (encode the dataset with a template).")
        logits = outputs["logits"] if isinstance(outputs, Mapping) and "logits" in outputs else \
            output_field(outputs, "logits")
        labels = inputs["labels"].to(logits.device)
        # shift the labels, not the logits: a slice of the (batch, seq, vocab) logits would be copied
        shift_labels = F.pad(labels, (0, 1), value=self.ignore_index)[..., 1:].reshape(-1)
        flat_logits = logits.reshape(-1, logits.shape[-1])
        if flat_logits.dtype != torch.float32:
            flat_logits = flat_logits.float()
        total = F.cross_entropy(flat_logits, shift_labels, ignore_index=self.ignore_index, reduction="sum")
        items = (shift_labels != self.ignore_index).sum()
        return total, items
