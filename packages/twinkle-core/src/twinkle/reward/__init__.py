"""Reward functions for RL: ``(completion, **row) -> float``, registered by name.

Built in: ``exact_match``, ``numeric_match`` (the last number of the completion against the
answer) and ``format_match`` (a regular expression). A script adds its own with
:func:`register_reward` or passes the function itself wherever a reward name is accepted.
Upstream Twinkle's reward objects (``GSM8KAccuracyReward()(trajectories)``, ``MathReward``,
``FormatReward``...) score trajectories.
"""

from twinkle.reward.builtin import exact_match, format_match, numeric_match
from twinkle.reward.objects import FormatReward, GSM8KAccuracyReward, GSM8KFormatReward, MathReward, Reward
from twinkle.reward.scoring import RewardError, register_reward, score

__all__ = ["FormatReward", "GSM8KAccuracyReward", "GSM8KFormatReward", "MathReward", "Reward", "RewardError",
           "exact_match", "format_match", "numeric_match", "register_reward", "score"]
