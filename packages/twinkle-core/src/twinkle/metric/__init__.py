"""Metrics accumulated by a model's forward passes and returned as plain numbers.

A model feeds each metric of a group with every forward (:meth:`Metric.update`) and every
computed loss (:meth:`Metric.update_loss`); ``calculate_metric`` returns :meth:`Metric.compute`
merged over the group's metrics plus the step numbers (grad_norm, lr, tokens/s, step) that the
group itself tracks, then resets them.
"""

from __future__ import annotations

from twinkle.metric.builtin import LossMetric, Metric, TokenAccuracy

__all__ = ["LossMetric", "Metric", "TokenAccuracy", "default_metrics"]


def default_metrics() -> list[Metric]:
    """The metrics every group starts with: the token-weighted loss and next-token accuracy."""
    return [LossMetric(), TokenAccuracy()]
