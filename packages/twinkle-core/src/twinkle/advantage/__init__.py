"""Advantage estimators: per-sample rewards -> per-sample advantages, registered by name.

Samples come in consecutive groups of ``group_size`` completions of one prompt (the order a sampler
returns them in). Each estimator is a plain function; ``resolve('advantage', 'grpo')`` returns it.
Upstream Twinkle's objects (``GRPOAdvantage()(rewards, num_generations=4)``, ``RLOOAdvantage``) wrap them.
"""

from twinkle.advantage.classes import Advantage, GRPOAdvantage, RLOOAdvantage
from twinkle.advantage.estimators import grpo, reward_minus_baseline, rloo

__all__ = ["Advantage", "GRPOAdvantage", "RLOOAdvantage", "grpo", "reward_minus_baseline", "rloo"]
