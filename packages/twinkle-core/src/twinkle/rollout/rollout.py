"""Rollout: one prompt and one sampled completion, readable as a row the InputProcessor pads or packs.

The row is in Tinker's layout (what the RL losses read, see :mod:`twinkle.loss.token_inputs`)::

    input_ids     = (prompt + completion)[:-1]
    target_tokens = (prompt + completion)[1:]
    weights       = 0 on the prompt's targets, the completion mask on the completion's
    logprobs      = 0 ...,  the sampling log-probability of each completion token
    advantages    = 0 ...,  the advantage of each completion token (one value broadcast, or per token)

A list of rollouts is a batch: ``model.forward_backward(inputs=rollouts)`` collates them with the
group's processor, padded (default) or packed, like SFT rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twinkle.sampler.types import SampleResult


def _numbers(values: Sequence[Any], name: str, length: int, finite: bool = True) -> list[float]:
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != length:
        raise ValueError(f"Rollout.{name} has {len(values)} values for {length} completion tokens.")
    out = [float(v) for v in values]
    if finite and not all(map(math.isfinite, out)):
        k = next(k for k, v in enumerate(out) if not math.isfinite(v))
        raise ValueError(f"Rollout.{name}[{k}] (completion token {k}) is {out[k]}; {name} must be finite numbers "
                         "(a NaN or inf would make the loss and every gradient of the step NaN).")
    return out


@dataclass
class Rollout(Mapping):
    """A sampled completion of a prompt with what the RL losses need (see the module docstring)."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float]
    advantages: float | Sequence[float] = 0.0
    mask: Sequence[int] | None = None
    reward: float | None = None
    _row: dict[str, list] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        self.completion_ids = [int(t) for t in self.completion_ids]
        if not self.prompt_ids or not self.completion_ids:
            raise ValueError(f"A Rollout needs a non-empty prompt and completion, got {len(self.prompt_ids)} prompt "
                             f"and {len(self.completion_ids)} completion tokens.")
        n = len(self.completion_ids)
        self.logprobs = _numbers(self.logprobs, "logprobs", n)
        if isinstance(self.advantages, (int, float)):
            self.advantages = _numbers([self.advantages] * n, "advantages", n)
        else:
            self.advantages = _numbers(self.advantages, "advantages", n)
        self.mask = [1] * n if self.mask is None else [int(bool(m)) for m in _numbers(self.mask, "mask", n, False)]
        pad = [0.0] * (len(self.prompt_ids) - 1)
        tokens = self.prompt_ids + self.completion_ids
        self._row = {"input_ids": tokens[:-1], "target_tokens": tokens[1:],
                     "weights": pad + [float(m) for m in self.mask], "logprobs": pad + list(self.logprobs),
                     "advantages": pad + list(self.advantages)}

    # the row view: a Rollout is read wherever an encoded row is
    def __getitem__(self, key: str) -> list:
        return self._row[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)

    @property
    def sequence(self) -> list[int]:
        """The whole token sequence, prompt then completion."""
        return self.prompt_ids + self.completion_ids


def rollouts_from_samples(results: Sequence[SampleResult], advantages: Sequence[float],
                          rewards: Sequence[float] | None = None) -> list[Rollout]:
    """One Rollout per sampled sequence, in sampler order (prompt by prompt, its ``n`` samples in a row)."""
    samples = [(result, seq) for result in results for seq in result.sequences]
    values = list(advantages.tolist() if hasattr(advantages, "tolist") else advantages)
    if len(values) != len(samples):
        raise ValueError(f"{len(values)} advantages for {len(samples)} samples; compute one per sampled sequence.")
    if rewards is not None and len(rewards) != len(samples):
        raise ValueError(f"{len(rewards)} rewards for {len(samples)} samples.")
    rollouts = []
    for k, ((result, seq), a) in enumerate(zip(samples, values)):
        try:
            rollouts.append(Rollout(result.prompt, seq.tokens, seq.logprobs, float(a),
                                    reward=None if rewards is None else rewards[k]))
        except ValueError as exc:
            prompt, number = _position(results, k)
            raise ValueError(f"sample {k} (prompt {prompt}, sequence {number}): {exc}") from None
    return rollouts


def _position(results: Sequence[SampleResult], index: int) -> tuple[int, int]:
    """(prompt, sequence) of the ``index``-th sampled sequence in sampler order."""
    for prompt, result in enumerate(results):
        if index < len(result.sequences):
            return prompt, index
        index -= len(result.sequences)
    raise IndexError(index)
