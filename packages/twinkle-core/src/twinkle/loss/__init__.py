"""Losses: a Loss maps (model inputs, model outputs) to a scalar tensor.

Every twinkle loss reports the *sum* of its per-item losses and how many items that sum covers
(:meth:`Loss.compute`), so a model can weight micro-batches by tokens during gradient
accumulation; calling the loss applies its ``reduction``.
"""

from __future__ import annotations

from twinkle.constants import IGNORE_INDEX
from twinkle.loss.base import Loss
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.grpo import BNPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss
from twinkle.loss.infonce import InfoNCELoss
from twinkle.loss.policy import CISPOLoss, DROLoss, ImportanceSamplingLoss, PPOLoss, TokenCrossEntropy
from twinkle.loss.preference import DPOLoss, IPOLoss, ORPOLoss, SimPOLoss
from twinkle.loss.token_inputs import TokenOutputs

__all__ = ["IGNORE_INDEX", "BNPOLoss", "CISPOLoss", "CrossEntropyLoss", "DPOLoss", "DROLoss",
           "DrGRPOLoss", "GRPOLoss", "GSPOLoss", "IPOLoss", "ImportanceSamplingLoss", "InfoNCELoss", "Loss",
           "ORPOLoss", "PPOLoss", "SimPOLoss", "TokenCrossEntropy", "TokenOutputs"]
