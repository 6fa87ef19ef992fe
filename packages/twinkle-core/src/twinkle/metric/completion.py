"""Upstream Twinkle's CompletionRewardMetric: RL rollouts' rewards, completion lengths and timings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.metric.builtin import Metric


class CompletionRewardMetric(Metric):
    """Per reward function its mean and std (``train/<name>_reward``, ``train/<name>_reward_std``), the mean
    completion length (``train/completion_length``) and the sampler's timings (``profiling/...``).

    Args:
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, device_mesh: Any = None, process_group: Any = None, **kwargs: Any) -> None:
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def accumulate(self, inputs: Any = None, outputs: Any = None, *,
                   rewards: Mapping[str, Sequence[float]] | None = None,
                   completion_lengths: Sequence[int] | None = None, generate_time: float | None = None,
                   weight_sync_time: float | None = None, **kwargs: Any) -> None:
        """Add one rollout batch's rewards (``{name: one value per completion}``), lengths and timings."""
        for name, values in (rewards or {}).items():
            self._rewards.setdefault(name, []).extend(float(v) for v in values)
        self._lengths.extend(int(n) for n in completion_lengths or ())
        if generate_time is not None:
            self._times["profiling/Time taken: generate"] = float(generate_time)
        if weight_sync_time is not None:
            self._times["profiling/Time taken: move_model_to_sampler"] = float(weight_sync_time)

    def compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, values in self._rewards.items():
            if values:
                out[f"train/{name}_reward"] = self._mean(values)
                out[f"train/{name}_reward_std"] = self._std(values)
        if self._lengths:
            out["train/completion_length"] = self._mean(self._lengths)
        out.update(self._times)
        return out

    def reset(self) -> None:
        self._rewards: dict[str, list[float]] = {}
        self._lengths: list[int] = []
        self._times: dict[str, float] = {}

    @staticmethod
    def _mean(values: Sequence[float]) -> float:
        """The mean; -1.0 for no values (upstream's marker)."""
        return sum(values) / len(values) if values else -1.0

    @staticmethod
    def _std(values: Sequence[float]) -> float:
        """The unbiased standard deviation; 0.0 for fewer than two values."""
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
