"""The per-token losses the Tinker API defines, by Tinker's names and exactly as Tinker defines them.

``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo`` and ``dro`` read ``target_tokens``,
``weights`` and, for RL, the sampling ``logprobs`` and ``advantages`` (see
:mod:`twinkle.loss.token_inputs` for the layouts). With ``p`` the learner's log-probability of a
target token, ``q`` the sampler's, ``A`` the advantage and ``r = exp(p - q)``:

=====================  ===============================================================
cross_entropy          ``-w * p``
importance_sampling    ``-w * r * A``
ppo                    ``-w * min(r * A, clip(r, low, high) * A)``
cispo                  ``-w * sg(clip(r, low, high)) * p * A``
dro                    ``-w * (p * A - beta / 2 * (p - q) ** 2)``
=====================  ===============================================================

The loss is the **sum** over every token (Tinker reports it as ``loss:sum``), with no division:
the loss reports :data:`~twinkle.loss.token_inputs.SUM_ITEMS` items, so under gradient
accumulation and data parallelism the applied gradient is the sum over every micro-batch and
rank, as Tinker's. ``reduction='mean'`` divides by the global sum of weights instead.
Tinker's RL formulas have no weights; without ``weights`` (and without padding) ours are exactly
theirs, and given weights multiply each token's term (0 drops prompt or padding positions).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss
from twinkle.loss.token_inputs import SUM_ITEMS, TokenOutputs, TokenView, loss_inputs


class TokenSumLoss(Loss):
    """Base of the per-token losses: ``sum_t w_t * token_loss_t`` and the target log-probabilities kept.

    Subclasses implement :meth:`token_loss`. After :meth:`compute`, ``last_outputs`` holds the
    per-token ``logprobs`` of the targets (Tinker's ``loss_fn_outputs``).
    """

    name = "token loss"

    def __init__(self, reduction: str = "sum") -> None:
        super().__init__(reduction)
        self.last_outputs: TokenOutputs | None = None

    @abstractmethod
    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        """The unweighted loss of every position (rows, T)."""

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        view, logprobs, _ = loss_inputs(inputs, outputs, self.name, kwargs)
        total = (self.token_loss(logprobs, view) * view.weights).sum()
        self.last_outputs = TokenOutputs({"logprobs": logprobs.detach()}, view.segments)
        return total, SUM_ITEMS if self.reduction == "sum" else view.weights.sum()


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """PPO's per-token objective, negated: ``-min(r A, clip(r, low, high) A)`` (PPO, GRPO and kin)."""
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def _ratio_bounds(clip_low_threshold: float, clip_high_threshold: float, name: str) -> tuple[float, float]:
    low, high = float(clip_low_threshold), float(clip_high_threshold)
    if not 0 <= low <= 1 <= high:
        raise ValueError(f"{name}: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold (ratio bounds, e.g. 0.8 "
                         f"and 1.2), got {clip_low_threshold!r} and {clip_high_threshold!r}.")
    return low, high


def epsilon_bounds(epsilon: float | None, epsilon_high: float | None, low: float, high: float, name: str,
                   clip_range: float | None = None) -> tuple[float, float]:
    """Ratio bounds from upstream Twinkle's ``epsilon``/``epsilon_high`` (``1 - eps``, ``1 + eps_high``), or as given.

    ``clip_range`` is the name upstream's documentation gives ``epsilon``.
    """
    if clip_range is not None:
        if epsilon is not None and epsilon != clip_range:
            raise ValueError(f"{name}: clip_range={clip_range!r} and epsilon={epsilon!r} name the same bound; "
                             "give one.")
        epsilon = clip_range
    if epsilon is None:
        if epsilon_high is not None:
            raise ValueError(f"{name}: epsilon_high= needs epsilon= too (or give clip_high_threshold=).")
        return low, high
    high_eps = epsilon if epsilon_high is None else epsilon_high
    return 1 - float(epsilon), 1 + float(high_eps)


class TokenCrossEntropy(TokenSumLoss):
    """Tinker's ``cross_entropy``: ``-sum_t w_t log p(target_t)``."""

    name = "cross_entropy"

    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        return -logprobs


class ImportanceSamplingLoss(TokenSumLoss):
    """Tinker's ``importance_sampling`` (REINFORCE with the sampler's correction): ``-r * A``."""

    name = "importance_sampling"

    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        return -torch.exp(view.log_ratio(logprobs)) * view.field("advantages")


class PPOLoss(TokenSumLoss):
    """Tinker's ``ppo``: the clipped surrogate ``-min(r A, clip(r, low, high) A)`` per token."""

    name = "ppo"

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2,
                 reduction: str = "sum", *, epsilon: float | None = None, epsilon_high: float | None = None,
                 clip_range: float | None = None) -> None:
        super().__init__(reduction)
        low, high = epsilon_bounds(epsilon, epsilon_high, clip_low_threshold, clip_high_threshold, self.name,
                                   clip_range)
        self.low, self.high = _ratio_bounds(low, high, self.name)

    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        return clipped_surrogate(torch.exp(view.log_ratio(logprobs)), view.field("advantages"), self.low, self.high)


class CISPOLoss(PPOLoss):
    """Tinker's ``cispo``: the clipped ratio, without gradient, weighs the log-probability."""

    name = "cispo"

    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        ratio = torch.exp(view.log_ratio(logprobs)).clamp(self.low, self.high).detach()
        return -ratio * logprobs * view.field("advantages")


class DROLoss(TokenSumLoss):
    """Tinker's ``dro``: ``-(p A - beta/2 (p - q)^2)``; the advantages are the client's soft estimate."""

    name = "dro"

    def __init__(self, beta: float = 0.05, reduction: str = "sum") -> None:
        super().__init__(reduction)
        if not beta >= 0:
            raise ValueError(f"dro: beta must be >= 0, got {beta!r}.")
        self.beta = float(beta)

    def token_loss(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        quadratic = view.log_ratio(logprobs) ** 2
        return -(logprobs * view.field("advantages") - 0.5 * self.beta * quadratic)
