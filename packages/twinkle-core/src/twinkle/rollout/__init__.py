"""Rollouts: sampled completions with their sampling log-probabilities and advantages, as training rows."""

from twinkle.rollout.rollout import Rollout, rollouts_from_samples

__all__ = ["Rollout", "rollouts_from_samples"]
