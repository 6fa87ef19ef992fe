"""The estimators: group-normalised (GRPO), leave-one-out (RLOO) and reward minus a baseline.

With rewards ``r`` of one group of ``G`` samples of the same prompt:

* ``grpo``:  ``(r_i - mean(r)) / (std + eps)`` (Shao et al. 2024; ``std`` unbiased, as TRL). ``scale``
  says which std: ``'group'`` (the default, also ``True``) the group's own, ``'batch'`` the std of every
  reward of the call (TRL's ``scale_rewards='batch'``, Liu et al. 2025's recommendation), ``'none'``
  (also ``False``) only centres (Dr. GRPO);
* ``rloo``:  ``r_i - mean_{j != i} r_j`` (Ahmadian et al. 2024), which equals
  ``G / (G - 1) * (r_i - mean(r))``;
* ``reward_minus_baseline``: ``r_i - b`` with a fixed ``b``, or the batch mean when ``baseline=None``.

``grpo`` and ``rloo`` compare each sample with the other samples of its prompt, so they need
``group_size >= 2``: a group of one has no baseline, and every advantage would be 0.

Rewards may be one value per sample, or a ``(samples, reward functions)`` table with one column per
reward function: the columns are summed into each sample's total reward first (as upstream Twinkle does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.utils.checks import check_int

#: what ``grpo(scale=...)`` divides the centred rewards by
SCALES = ("group", "batch", "none")
_NO_BASELINE = (" (a group of one sample has no baseline: every advantage would be 0; sample n >= 2 completions "
                "per prompt, or use reward_minus_baseline)")


def total_rewards(rewards: Sequence[float] | Sequence[Sequence[float]] | torch.Tensor, name: str) -> torch.Tensor:
    """One float64 total per sample: a 1-D input as is, a 2-D ``(samples, reward functions)`` one summed per row.

    Flattening a table instead would give one advantage per (sample, reward) pair: too many, and misaligned.
    """
    values = torch.as_tensor(rewards, dtype=torch.float64)
    if values.dim() == 2:
        return values.sum(dim=1)
    if values.dim() > 2:
        raise ValueError(f"{name}: rewards of shape {tuple(values.shape)} have more than 2 dimensions; give one reward "
                         "per sample, or a (samples, reward functions) table whose columns are summed.")
    return values.reshape(-1)


def grouped_rewards(rewards: Sequence[float] | torch.Tensor, group_size: int, name: str,
                    minimum: int = 1) -> torch.Tensor:
    """The samples' total rewards as a ``(groups, group_size)`` float64 tensor, checked whole and finite."""
    values = total_rewards(rewards, name)
    check_int(group_size, f"{name}: group_size", minimum, _NO_BASELINE if minimum == 2 else "")
    if values.numel() == 0 or values.numel() % group_size:
        raise ValueError(f"{name}: {values.numel()} rewards are not whole groups of {group_size}; give every prompt's "
                         "samples together, in the order the sampler returned them.")
    if not torch.isfinite(values).all():
        bad = int((~torch.isfinite(values)).nonzero()[0])
        raise ValueError(f"{name}: reward {bad} is {float(values[bad])} (NaN or inf); a reward function must return a "
                         "finite number.")
    return values.view(-1, group_size)


def _scale(scale: bool | str, name: str = "grpo") -> str:
    if scale is True:
        return "group"
    if scale is False:
        return "none"
    if scale not in SCALES:
        raise ValueError(f"{name}: scale={scale!r} is not one of {', '.join(SCALES)} (or True = 'group', False = "
                         "'none').")
    return scale


def grpo(rewards: Sequence[float] | torch.Tensor, group_size: int, *, scale: bool | str = True,
         eps: float = 1e-4) -> torch.Tensor:
    """Group-centred advantages, divided by the std of ``scale`` (see the module docstring).

    A group whose rewards are all equal gets zeros (with ``'group'``, ``std = 0`` and the numerator is 0).
    """
    mode = _scale(scale)
    groups = grouped_rewards(rewards, group_size, "grpo", minimum=2)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return _divide(centred, groups, mode, eps).reshape(-1).float()


def rloo(rewards: Sequence[float] | torch.Tensor, group_size: int, *, scale: bool | str = "none",
         eps: float = 1e-4) -> torch.Tensor:
    """Leave-one-out baseline: each sample against the mean of the other samples of its group.

    ``scale`` divides by the std of the group's (``'group'``) or the call's (``'batch'``) rewards; the
    default ``'none'`` leaves the advantages in reward units.
    """
    mode = _scale(scale, "rloo")
    groups = grouped_rewards(rewards, group_size, "rloo", minimum=2)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return _divide(groups - others, groups, mode, eps).reshape(-1).float()


def _divide(advantages: torch.Tensor, groups: torch.Tensor, mode: str, eps: float) -> torch.Tensor:
    """``advantages`` over the std of the rewards named by ``mode`` (unbiased, as TRL), plus ``eps``."""
    if mode == "group":
        return advantages / (groups.std(dim=1, keepdim=True) + eps)
    if mode == "batch":
        return advantages / (groups.std() + eps)
    return advantages


def reward_minus_baseline(rewards: Sequence[float] | torch.Tensor, group_size: int = 1, *,
                          baseline: float | None = None) -> torch.Tensor:
    """``reward - baseline``; ``baseline=None`` uses the mean reward of the batch."""
    values = grouped_rewards(rewards, group_size, "reward_minus_baseline").reshape(-1)
    return (values - (values.mean() if baseline is None else float(baseline))).float()
