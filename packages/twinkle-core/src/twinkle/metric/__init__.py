"""Metrics accumulated by a model's forward passes and returned as plain numbers.

A model feeds each metric of a group with every forward (:meth:`Metric.update`) and every
computed loss (:meth:`Metric.update_loss`); ``calculate_metric`` returns :meth:`Metric.compute`
merged over the group's metrics plus the step numbers (grad_norm, lr, tokens/s, step) that the
group itself tracks, then resets them. Upstream Twinkle's ``accumulate``/``calculate`` and its metric names
(``Accuracy``, ``TrainMetric``, ``CompletionRewardMetric``, ``DPOMetric``, ``GRPOMetric``, ...) work too.
"""

from __future__ import annotations

from twinkle.metric.builtin import Accuracy, LossMetric, Metric, TokenAccuracy
from twinkle.metric.completion import CompletionRewardMetric
from twinkle.metric.embedding import EmbeddingMetric
from twinkle.metric.policy import CISPOMetric, DPOMetric, GRPOMetric, GSPOMetric
from twinkle.metric.train import TrainMetric

__all__ = ["Accuracy", "CISPOMetric", "CompletionRewardMetric", "DPOMetric", "EmbeddingMetric", "GRPOMetric",
           "GSPOMetric", "LossMetric", "Metric", "TokenAccuracy", "TrainMetric", "default_metrics"]


def default_metrics() -> list[Metric]:
    """The metrics every group starts with: the token-weighted loss and next-token accuracy."""
    return [LossMetric(), TokenAccuracy()]
