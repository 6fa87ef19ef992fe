"""Next-token cross-entropy over the labels a template produced (-100 marks untrained tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX
from twinkle.loss.base import Loss, output_field

#: how tokens are weighted (xtuner's CELossConfig.loss_reduction): each token the same, each sample the same
#: (1 / its trained tokens), or 1 / sqrt(its trained tokens)
LOSS_REDUCTIONS = ("token", "sample", "square")


class CrossEntropyLoss(Loss):
    """Logits at position t predict ``labels[t + 1]``; ``ignore_index`` positions are skipped.

    The mean is over trained tokens, so accumulating micro-batches by their token counts gives
    exactly the loss of the concatenated batch. ``loss_reduction='sample'`` / ``'square'`` weight each
    token by 1 / n or 1 / sqrt(n) of its row's n trained tokens (rows of a padded batch); the mean is then
    over those weights, so accumulation stays exact.
    """

    def __init__(self, reduction: str = "mean", ignore_index: int = IGNORE_INDEX,
                 loss_reduction: str = "token") -> None:
        super().__init__(reduction)
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}.")
        self.ignore_index = ignore_index
        self.loss_reduction = loss_reduction

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
        if self.loss_reduction != "token":
            return self._weighted(flat_logits, shift_labels, labels.shape)
        total = F.cross_entropy(flat_logits, shift_labels, ignore_index=self.ignore_index, reduction="sum")
        items = (shift_labels != self.ignore_index).sum()
        return total, items

    def _weighted(self, flat_logits: torch.Tensor, shift_labels: torch.Tensor, shape: torch.Size
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(shape) != 2:
            raise ValueError(f"loss_reduction={self.loss_reduction!r} weights the rows of a padded (batch, sequence) "
                             f"batch; this one has shape {tuple(shape)}.")
        per_token = F.cross_entropy(flat_logits, shift_labels, ignore_index=self.ignore_index, reduction="none")
        trained = (shift_labels != self.ignore_index).reshape(shape).float()
        counts = trained.sum(dim=1, keepdim=True).clamp(min=1)
        weights = trained / (counts if self.loss_reduction == "sample" else counts.sqrt())
        weights = weights * (trained.sum(dim=1, keepdim=True) > 0)
        return (per_token.reshape(shape) * weights).sum(), weights.sum()
