"""The estimators: group-normalised (GRPO), leave-one-out (RLOO) and reward minus a baseline.

With rewards ``r`` of one group of ``G`` samples of the same prompt:

* ``grpo``:  ``(r_i - mean(r)) / (std(r) + eps)`` (Shao et al. 2024; ``std`` unbiased, as TRL);
  ``scale=False`` keeps only the centring (Dr. GRPO, Liu et al. 2025);
* ``rloo``:  ``r_i - mean_{j != i} r_j`` (Ahmadian et al. 2024), which equals
  ``G / (G - 1) * (r_i - mean(r))``;
* ``reward_minus_baseline``: ``r_i - b`` with a fixed ``b``, or the batch mean when ``baseline=None``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.utils.checks import check_int


def _groups(rewards: Sequence[float] | torch.Tensor, group_size: int, name: str, minimum: int = 1) -> torch.Tensor:
    values = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    check_int(group_size, f"{name}: group_size", minimum)
    if values.numel() == 0 or values.numel() % group_size:
        raise ValueError(f"{name}: {values.numel()} rewards are not whole groups of {group_size}; give every prompt's "
                         "samples together, in the order the sampler returned them.")
    if not torch.isfinite(values).all():
        raise ValueError(f"{name}: the rewards contain NaN or inf; a reward function must return a finite number.")
    return values.view(-1, group_size)


def grpo(rewards: Sequence[float] | torch.Tensor, group_size: int, *, scale: bool = True,
         eps: float = 1e-4) -> torch.Tensor:
    """Group-normalised advantages; a group whose rewards are all equal gets zeros."""
    groups = _groups(rewards, group_size, "grpo")
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1).float()


def rloo(rewards: Sequence[float] | torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out baseline: each sample against the mean of the other samples of its group."""
    groups = _groups(rewards, group_size, "rloo", minimum=2)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1).float()


def reward_minus_baseline(rewards: Sequence[float] | torch.Tensor, group_size: int = 1, *,
                          baseline: float | None = None) -> torch.Tensor:
    """``reward - baseline``; ``baseline=None`` uses the mean reward of the batch."""
    values = _groups(rewards, group_size, "reward_minus_baseline").reshape(-1)
    return (values - (values.mean() if baseline is None else float(baseline))).float()
