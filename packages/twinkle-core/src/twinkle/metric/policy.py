"""Upstream Twinkle's RL and preference diagnostics: DPOMetric, GRPOMetric (GSPOMetric, CISPOMetric).

They read per-token ``logps`` in the outputs, aligned with the tokens like every per-token field of label
rows (``logps[:, t]`` is the log-probability of ``labels[:, t]``), counted where ``labels != -100``.
Sums stay device tensors until :meth:`compute`, as every twinkle metric keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from twinkle.constants import IGNORE_INDEX
from twinkle.metric.builtin import Metric


def _logps(outputs: Any) -> torch.Tensor | None:
    value = outputs.get("logps") if isinstance(outputs, Mapping) else getattr(outputs, "logps", None)
    return value.detach() if isinstance(value, torch.Tensor) else None


def _mask(inputs: Mapping[str, Any], like: torch.Tensor, ignore_index: int) -> torch.Tensor:
    labels = torch.as_tensor(inputs["labels"], device=like.device)
    if labels.shape != like.shape:
        raise ValueError(f"logps of shape {tuple(like.shape)} do not match the labels' {tuple(labels.shape)}.")
    return labels != ignore_index


class DPOMetric(Metric):
    """Mean chosen/rejected sequence log-probabilities and, given a reference, DPO's implicit rewards.

    Rows come as pairs ``chosen, rejected, ...`` (one sequence per row). Reports ``logps/chosen``,
    ``logps/rejected`` and with ``ref_outputs={'logps': ...}`` ``rewards/chosen``, ``rewards/rejected``,
    ``rewards/margins`` and ``rewards/accuracies`` (the share of pairs whose chosen reward is higher).

    Args:
        beta: DPO's temperature of the implicit reward ``beta (pi - ref)``.
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, beta: float = 0.1, ignore_index: int = IGNORE_INDEX, device_mesh: Any = None,
                 process_group: Any = None, **kwargs: Any) -> None:
        self.beta, self.ignore_index = float(beta), ignore_index
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        self.accumulate(inputs, outputs)

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, *,
                   ref_outputs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Add one batch of pairs (and the reference's logps on the same batch)."""
        logps = _logps(outputs)
        if logps is None or inputs is None or "labels" not in inputs:
            return
        mask = _mask(inputs, logps, self.ignore_index)
        if logps.shape[0] % 2:
            raise ValueError(f"DPOMetric needs (chosen, rejected) pairs of rows: an even number of rows, got "
                             f"{logps.shape[0]}.")
        pi = (logps * mask).sum(dim=-1)
        self._add("logps/chosen", pi[0::2])
        self._add("logps/rejected", pi[1::2])
        ref = _logps(ref_outputs) if ref_outputs is not None else None
        if ref is not None:
            rewards = self.beta * (pi - (ref.to(pi) * mask).sum(dim=-1))
            chosen, rejected = rewards[0::2], rewards[1::2]
            self._add("rewards/chosen", chosen)
            self._add("rewards/rejected", rejected)
            self._add("rewards/margins", chosen - rejected)
            self._add("rewards/accuracies", (chosen > rejected).float())

    def _add(self, name: str, values: torch.Tensor) -> None:
        total, count = self._sums.get(name, (0.0, 0))
        self._sums[name] = (total + values.float().sum(), count + values.numel())

    @property
    def total_count(self) -> int:
        """Pairs accumulated (upstream's attribute)."""
        return self._sums.get("logps/chosen", (0.0, 0))[1]

    def compute(self) -> dict[str, float]:
        return {name: float(total) / count for name, (total, count) in self._sums.items() if count}

    def reset(self) -> None:
        self._sums: dict[str, tuple[Any, int]] = {}


class GRPOMetric(Metric):
    """Token means of the policy's log-probabilities and, given the sampler's, their drift.

    Reports ``train/mean_new_logp``, ``train/policy_confidence`` (mean token probability), with
    ``old_logps=`` ``train/logp_diff_mean`` (new - old) and ``train/approx_kl`` (the k3 estimator
    ``exp(old - new) - (old - new) - 1``), and ``train/entropy`` from ``outputs['entropies']``.
    ``old_logps`` is per token (the shape of ``logps``) or a list with each row's trained tokens' values.

    Args:
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, ignore_index: int = IGNORE_INDEX, device_mesh: Any = None, process_group: Any = None,
                 **kwargs: Any) -> None:
        self.ignore_index = ignore_index
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        self.accumulate(inputs, outputs)

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, *,
                   old_logps: torch.Tensor | Sequence[torch.Tensor] | None = None, **kwargs: Any) -> None:
        """Add one batch's trained tokens."""
        logps = _logps(outputs)
        if logps is None or inputs is None or "labels" not in inputs:
            return
        mask = _mask(inputs, logps, self.ignore_index)
        new = logps[mask].float()
        self._tokens += int(mask.sum())
        self._sum_new = self._sum_new + new.sum()
        self._sum_prob = self._sum_prob + new.exp().sum()
        if old_logps is not None:
            old = torch.as_tensor(old_logps, device=logps.device).float()[mask] \
                if isinstance(old_logps, torch.Tensor) and old_logps.shape == logps.shape \
                else torch.cat([torch.as_tensor(o, device=logps.device).float().reshape(-1) for o in old_logps])
            if old.numel() != new.numel():
                raise ValueError(f"GRPOMetric: old_logps cover {old.numel()} tokens, the batch trains {new.numel()}.")
            delta = old - new
            self._sum_diff = self._sum_diff + (-delta).sum()
            self._sum_kl = self._sum_kl + (delta.exp() - delta - 1).sum()
            self._old_tokens += new.numel()
        entropies = outputs.get("entropies") if isinstance(outputs, Mapping) else None
        if isinstance(entropies, torch.Tensor):
            self._sum_entropy = self._sum_entropy + entropies.detach().float()[mask].sum()
            self._entropy_tokens += new.numel()

    @property
    def n_tokens(self) -> int:
        """Trained tokens accumulated (upstream's attribute)."""
        return self._tokens

    @property
    def sum_new(self) -> float:
        """Sum of their log-probabilities (upstream's attribute)."""
        return float(self._sum_new)

    def compute(self) -> dict[str, float]:
        if not self._tokens:
            return {}
        out = {"train/mean_new_logp": float(self._sum_new) / self._tokens,
               "train/policy_confidence": float(self._sum_prob) / self._tokens}
        if self._old_tokens:
            out["train/logp_diff_mean"] = float(self._sum_diff) / self._old_tokens
            out["train/approx_kl"] = float(self._sum_kl) / self._old_tokens
        if self._entropy_tokens:
            out["train/entropy"] = float(self._sum_entropy) / self._entropy_tokens
        return out

    def reset(self) -> None:
        self._tokens = self._old_tokens = self._entropy_tokens = 0
        self._sum_new: Any = 0.0
        self._sum_prob: Any = 0.0
        self._sum_diff: Any = 0.0
        self._sum_kl: Any = 0.0
        self._sum_entropy: Any = 0.0


class GSPOMetric(GRPOMetric):
    """Upstream's name for the GSPO runs' metric: the same token diagnostics as :class:`GRPOMetric`."""


class CISPOMetric(GRPOMetric):
    """Upstream's name for the CISPO runs' metric: the same token diagnostics as :class:`GRPOMetric`."""
