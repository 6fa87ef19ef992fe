"""Upstream Twinkle's advantage objects: ``GRPOAdvantage()(rewards, num_generations=4, scale='group')``.

They call the estimators of :mod:`twinkle.advantage.estimators` with upstream's defaults: ``scale='group'``
for both (RLOO too), ``eps=1e-8``, and GRPO accepts ``num_generations=1`` (no groups: ``'group'`` returns
the rewards themselves, ``'none'`` subtracts the batch mean, ``'batch'`` also divides by the batch std).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from twinkle.advantage.estimators import SCALES, grouped_rewards, grpo, rloo
from twinkle.utils.checks import check_choice

Scale = Literal["group", "batch", "none"]


class Advantage:
    """Base of advantage objects: ``adv(rewards, num_generations=1, scale='group') -> float32 tensor``.

    Args:
        eps: added to the std before dividing by it (upstream's 1e-8; the ``grpo`` function uses 1e-4).
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = float(eps)

    def __call__(self, rewards: torch.Tensor | Sequence[float], num_generations: int = 1, scale: Scale = "group",
                 **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not compute advantages; use GRPOAdvantage or "
                                  "RLOOAdvantage.")


class GRPOAdvantage(Advantage):
    """Each reward minus its group's mean, divided per ``scale`` (see :func:`twinkle.advantage.grpo`)."""

    def __call__(self, rewards: torch.Tensor | Sequence[float], num_generations: int = 1, scale: Scale = "group",
                 **kwargs: Any) -> torch.Tensor:
        """Advantages of ``rewards`` (one per sample, or a table with one column per reward function, summed).

        Args:
            rewards: consecutive groups of ``num_generations`` samples of one prompt.
            num_generations: samples per prompt; 1 means the batch has no groups.
            scale: ``'group'``, ``'batch'`` or ``'none'``.

        Returns:
            A float32 tensor with one advantage per sample.
        """
        check_choice(scale, "GRPOAdvantage: scale", SCALES)
        if num_generations == 1:
            return self._ungrouped(rewards, scale)
        return grpo(rewards, num_generations, scale=scale, eps=self.eps)

    def _ungrouped(self, rewards: torch.Tensor | Sequence[float], scale: str) -> torch.Tensor:
        values = grouped_rewards(rewards, 1, "GRPOAdvantage").reshape(-1)
        if scale == "group":
            return values.float()
        centred = values - values.mean()
        if scale == "batch" and values.numel() > 1:
            centred = centred / (values.std() + self.eps)
        return centred.float()


class RLOOAdvantage(Advantage):
    """Each reward minus the mean of the other rewards of its group (see :func:`twinkle.advantage.rloo`)."""

    def __call__(self, rewards: torch.Tensor | Sequence[float], num_generations: int = 1, scale: Scale = "group",
                 **kwargs: Any) -> torch.Tensor:
        """Leave-one-out advantages of ``rewards``; ``num_generations`` must be at least 2.

        Args:
            rewards: consecutive groups of ``num_generations`` samples of one prompt.
            num_generations: samples per prompt (>= 2: a group of one has no other samples).
            scale: ``'group'`` (upstream's default), ``'batch'`` or ``'none'``.

        Returns:
            A float32 tensor with one advantage per sample.
        """
        check_choice(scale, "RLOOAdvantage: scale", SCALES)
        return rloo(rewards, num_generations, scale=scale, eps=self.eps)
