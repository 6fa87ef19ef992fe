"""Losses: a Loss maps (model inputs, model outputs) to a scalar loss.

Every twinkle loss reports the *sum* of its per-item losses and how many items that sum covers
(:meth:`Loss.compute`), so a model can weight micro-batches by tokens during gradient
accumulation; calling the loss applies its ``reduction`` and returns upstream Twinkle's
``{'loss': ..., 'num_tokens': ...}`` (:class:`LossOutput`).
"""

from __future__ import annotations

from twinkle.constants import IGNORE_INDEX
from twinkle.loss.base import Loss, LossOutput
from twinkle.loss.chunked_cross_entropy import ChunkedCrossEntropyLoss
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.gkd import GKDLoss
from twinkle.loss.grpo import BNPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss, SAPOLoss
from twinkle.loss.infonce import InfoNCELoss
from twinkle.loss.mse import MSELoss
from twinkle.loss.policy import CISPOLoss, DROLoss, ImportanceSamplingLoss, PPOLoss, TokenCrossEntropy
from twinkle.loss.preference import CPOLoss, DPOLoss, IPOLoss, ORPOLoss, SimPOLoss
from twinkle.loss.token_inputs import TokenOutputs

#: upstream Twinkle's spelling
DRGRPOLoss = DrGRPOLoss

__all__ = [
    "IGNORE_INDEX", "BNPOLoss", "CISPOLoss", "CPOLoss", "ChunkedCrossEntropyLoss", "CrossEntropyLoss", "DPOLoss",
    "DRGRPOLoss", "DROLoss", "DrGRPOLoss", "GKDLoss", "GRPOLoss", "GSPOLoss", "IPOLoss", "ImportanceSamplingLoss",
    "InfoNCELoss", "Loss", "LossOutput", "MSELoss", "ORPOLoss", "PPOLoss", "SAPOLoss", "SimPOLoss",
    "TokenCrossEntropy", "TokenOutputs"
]
