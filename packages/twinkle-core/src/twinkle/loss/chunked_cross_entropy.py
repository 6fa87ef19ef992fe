"""Cross-entropy over the logits in chunks of positions, so the float32 log-softmax never exists whole."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from twinkle.constants import IGNORE_INDEX, SHIFT_LABELS
from twinkle.loss.base import output_field
from twinkle.loss.cross_entropy import CrossEntropyLoss, _has
from twinkle.utils.checks import check_int


class ChunkedCrossEntropyLoss(CrossEntropyLoss):
    """:class:`CrossEntropyLoss` computed ``chunk_size`` positions at a time.

    Each chunk's float32 copy and log-softmax are recomputed in the backward (activation checkpointing)
    instead of kept, so the extra memory is one chunk's ``chunk_size x vocab`` rather than the batch's.
    The value equals the unchunked loss up to the order of the float32 summation.

    Args:
        chunk_size: positions per chunk (>= 1).
        reduction, ignore_index, dft: as :class:`CrossEntropyLoss` (token weighting only).
    """

    def __init__(self, chunk_size: int = 1024, reduction: str = "mean", ignore_index: int = IGNORE_INDEX,
                 dft: bool = False) -> None:
        super().__init__(reduction, ignore_index, "token", dft)
        self.chunk_size = check_int(chunk_size, "ChunkedCrossEntropyLoss: chunk_size")

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if ("labels" not in inputs and SHIFT_LABELS not in inputs) or (_has(outputs, "logps")
                                                                      and not _has(outputs, "logits")):
            return super().compute(inputs, outputs, **kwargs)
        logits = output_field(outputs, "logits")
        targets = self.next_tokens(inputs, logits.device).reshape(-1)
        flat = logits.reshape(-1, logits.shape[-1])
        total = flat.new_zeros((), dtype=torch.float32)
        for start in range(0, flat.shape[0], self.chunk_size):
            part, part_targets = flat[start:start + self.chunk_size], targets[start:start + self.chunk_size]
            if flat.requires_grad:
                total = total + checkpoint(self._chunk_sum, part, part_targets, use_reentrant=False)
            else:
                total = total + self._chunk_sum(part, part_targets)
        return total, (targets != self.ignore_index).sum()

    def _chunk_sum(self, part: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.token_losses(part.float(), targets).sum()
