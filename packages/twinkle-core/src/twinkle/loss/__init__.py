"""Losses: a Loss maps (model inputs, model outputs) to a scalar tensor.

Every twinkle loss reports the *sum* of its per-item losses and how many items that sum covers
(:meth:`Loss.compute`), so a model can weight micro-batches by tokens during gradient
accumulation; calling the loss applies its ``reduction``.
"""

from __future__ import annotations

from twinkle.loss.base import IGNORE_INDEX, Loss
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.infonce import InfoNCELoss

__all__ = ["IGNORE_INDEX", "CrossEntropyLoss", "InfoNCELoss", "Loss"]
