"""The GRPO family and GSPO: clipped policy-gradient losses that differ in how they normalise.

Per token, with ``r = exp(p - q)`` (learner vs sampler log-probability) and advantage ``A``::

    l_t = -min(r A, clip(r, low, high) A) + beta * KL_t,     KL_t = exp(ref - p) - (ref - p) - 1

(``KL_t`` is the k3 estimator of DeepSeekMath against the reference log-probabilities
``ref_logprobs``; with ``beta > 0`` a model computes them itself, for a LoRA adapter from the base
with adapters disabled.) The losses weigh ``l_t`` by the token weights ``w_t`` and normalise:

* ``grpo`` (Shao et al. 2024): each sequence's weighted token mean, averaged over sequences;
* ``bnpo``: the weighted token mean over the whole batch;
* ``dr_grpo`` (Liu et al. 2025, "Dr. GRPO"): the token sum divided by ``max_tokens`` (the
  generation budget) per sequence, so no length bias.

``gspo`` (Zheng et al. 2025) clips a sequence-level ratio ``s_i = exp(mean_t (p - q))`` (its
GSPO-token form: the ratio's value is ``s_i`` at every token and its gradient ``s_i * grad p_t``,
identical to GSPO when advantages are constant per sequence) and averages like ``grpo``; its
default bounds are the paper's ``1 - 3e-4`` and ``1 + 4e-4``.

Every denominator is a count of sequences or tokens, so the model's global normalisation keeps the
losses exact under gradient accumulation and data parallelism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss
from twinkle.loss.policy import _ratio_bounds, clipped_surrogate, epsilon_bounds
from twinkle.loss.token_inputs import TokenOutputs, TokenView, loss_inputs, token_entropies

NORMALIZATIONS = ("sequence", "token", "constant")


class GRPOLoss(Loss):
    """Clipped surrogate + optional KL, normalised per ``normalization`` (see the module docstring).

    Args:
        clip_low_threshold, clip_high_threshold: the ratio's clip bounds (Tinker's names).
        beta: the KL coefficient (0: no reference forward).
        max_tokens: the generation budget (``dr_grpo`` only; upstream's ``max_completion_length``).
        entropy_coef: subtracts this times each token's policy entropy (an exploration bonus): from
            ``outputs['entropies']`` (aligned like ``logps``) or computed from the logits.
        epsilon, epsilon_high: upstream Twinkle's bounds ``1 - epsilon`` and ``1 + epsilon_high`` (default
            ``epsilon``); given, they replace the thresholds. ``clip_range`` is another name of ``epsilon``.

    A call may pass upstream's per-call fields ``advantages=``, ``old_logps=``, ``ref_logps=`` (per token or
    per sequence; see :func:`twinkle.loss.token_inputs.with_call_options`). Without the sampler's
    ``logprobs`` the update is taken as on-policy, as upstream takes it: the ratio is 1 (its gradient kept).
    """

    name = "grpo"
    normalization = "sequence"

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2, beta: float = 0.0,
                 max_tokens: int | None = None, *, epsilon: float | None = None,
                 epsilon_high: float | None = None, clip_range: float | None = None,
                 max_completion_length: int | None = None, entropy_coef: float = 0.0) -> None:
        super().__init__("mean")
        if not entropy_coef >= 0:
            raise ValueError(f"{self.name}: entropy_coef must be >= 0, got {entropy_coef!r}.")
        self.entropy_coef = float(entropy_coef)
        if max_completion_length is not None:  # upstream's name of the generation budget
            if max_tokens is not None and max_tokens != max_completion_length:
                raise ValueError(f"{self.name}: max_tokens={max_tokens!r} and max_completion_length="
                                 f"{max_completion_length!r} name the same budget; give one.")
            max_tokens = max_completion_length
        clip_low_threshold, clip_high_threshold = epsilon_bounds(epsilon, epsilon_high, clip_low_threshold,
                                                                 clip_high_threshold, self.name, clip_range)
        self.low, self.high = _ratio_bounds(clip_low_threshold, clip_high_threshold, self.name)
        if not beta >= 0:
            raise ValueError(f"{self.name}: beta (the KL coefficient) must be >= 0, got {beta!r}.")
        self.beta = float(beta)
        if self.normalization == "constant" and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                                 or max_tokens < 1):
            raise ValueError(f"{self.name} divides by the generation budget: pass max_tokens=<the sampler's "
                             f"max_tokens> (a positive int), got {max_tokens!r}.")
        self.max_tokens = max_tokens
        self.last_outputs: TokenOutputs | None = None

    @property
    def needs_reference(self) -> bool:
        """Whether a forward must provide ``ref_logprobs`` (a KL penalty is on)."""
        return self.beta > 0

    def ratio(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        return torch.exp(view.log_ratio(logprobs))

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        view, logprobs, logits = loss_inputs(inputs, outputs, self.name, kwargs)
        if "logprobs" not in view.fields:  # on-policy (one update per rollout, as upstream): the ratio is 1
            view.fields["logprobs"] = logprobs.detach()
        per_token = self.surrogate(self.ratio(logprobs, view), view.field("advantages"))
        if self.beta > 0:
            delta = -view.log_ratio(logprobs, "ref_logprobs")
            per_token = per_token + self.beta * (torch.exp(delta) - delta - 1)
        if self.entropy_coef > 0:
            per_token = per_token - self.entropy_coef * token_entropies(outputs, logits, view, self.name)
        self.last_outputs = TokenOutputs({"logprobs": logprobs.detach()}, view.segments)
        return self._normalise(per_token * view.weights, view)

    def surrogate(self, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """The per-token policy loss before the KL term: PPO's clipped surrogate."""
        return clipped_surrogate(ratio, advantages, self.low, self.high)

    def _normalise(self, weighted: torch.Tensor, view: TokenView) -> tuple[torch.Tensor, Any]:
        if self.normalization == "token":
            return weighted.sum(), view.weights.sum()
        trained = view.trained_sequences()
        if self.normalization == "constant":
            return weighted.sum(), trained.sum() * self.max_tokens
        sums, weights = view.per_sequence(weighted), view.per_sequence(view.weights)
        # untrained slots divide 0 by 1, not by 0: a NaN there would reach the gradient through where()
        return (sums / torch.where(trained, weights, torch.ones_like(weights))).sum(), trained.sum()


class BNPOLoss(GRPOLoss):
    """``bnpo``: GRPO's surrogate, normalised by the batch's weighted token count."""

    name = "bnpo"
    normalization = "token"


class DrGRPOLoss(GRPOLoss):
    """``dr_grpo``: GRPO's surrogate, divided by ``max_tokens`` per sequence (no length normalisation)."""

    name = "dr_grpo"
    normalization = "constant"


class GSPOLoss(GRPOLoss):
    """``gspo``: a length-normalised sequence ratio, clipped per sequence (GSPO-token form)."""

    name = "gspo"

    def __init__(self, clip_low_threshold: float = 1 - 3e-4, clip_high_threshold: float = 1 + 4e-4,
                 beta: float = 0.0, *, epsilon: float | None = None, epsilon_high: float | None = None,
                 clip_range: float | None = None) -> None:
        super().__init__(clip_low_threshold, clip_high_threshold, beta, epsilon=epsilon, epsilon_high=epsilon_high,
                         clip_range=clip_range)

    def ratio(self, logprobs: torch.Tensor, view: TokenView) -> torch.Tensor:
        weights = view.weights
        log_ratio = view.per_sequence(view.log_ratio(logprobs) * weights) / \
            view.per_sequence(weights).clamp(min=1e-12)
        per_position = log_ratio.detach()[view.segments.clamp(min=0)]
        return torch.exp(per_position + logprobs - logprobs.detach())


class SAPOLoss(GRPOLoss):
    """``sapo`` (Gao et al. 2025, Soft Adaptive Policy Optimization): a soft gate instead of the clip.

    Per token ``-f(r) A`` with ``f(r) = 4 / tau * sigmoid(tau (r - 1))``, ``tau = tau_pos`` where ``A > 0``
    and ``tau_neg`` elsewhere. Its slope at ``r = 1`` is 1, so the on-policy gradient is GRPO's; away from 1
    the gradient fades smoothly instead of dropping to 0 at a clip bound. Normalised like ``grpo``;
    ``beta`` adds the same KL term.

    Args:
        tau_pos, tau_neg: the gate's temperatures for positive and negative advantages (> 0).
        beta: the KL coefficient.
        tau: sets both temperatures (upstream's documented name).
        epsilon, clip_range: accepted for upstream's signature; the soft gate has no clip bounds.
    """

    name = "sapo"

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.0, beta: float = 0.0, *, tau: float | None = None,
                 epsilon: float | None = None, clip_range: float | None = None) -> None:
        super().__init__(beta=beta, epsilon=epsilon, clip_range=clip_range)
        if tau is not None:
            tau_pos = tau_neg = tau
        for label, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
            if not tau > 0:
                raise ValueError(f"sapo: {label} must be > 0, got {tau!r}.")
        self.tau_pos, self.tau_neg = float(tau_pos), float(tau_neg)

    def surrogate(self, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        tau = torch.where(advantages > 0, torch.full_like(ratio, self.tau_pos), torch.full_like(ratio, self.tau_neg))
        return -torch.sigmoid(tau * (ratio - 1)) * (4 / tau) * advantages
