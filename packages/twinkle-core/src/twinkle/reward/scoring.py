"""Scoring completions with several rewards, and registering a reward from a script."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twinkle.registry import register, resolve

RewardFn = Callable[..., float]


class RewardError(RuntimeError):
    """A reward function raised: names the reward and the completion (its index in ``score``'s list).

    The reward's own exception is the ``__cause__``; ``reward`` and ``index`` hold the two names.
    """

    def __init__(self, message: str, reward: str, index: int) -> None:
        super().__init__(message)
        self.reward = reward
        self.index = index


def reward_name(reward: Any) -> str:
    """How a reward is named in messages: its registered name, or a function's qualified name."""
    return reward if isinstance(reward, str) else getattr(reward, "__qualname__", None) or repr(reward)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make a function a reward named ``name`` (listed by ``twinkle plugins`` as ``<script>``)."""

    def decorate(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}) decorates a function, got {type(fn).__name__}.")
        return register("reward", name, fn)

    return decorate


def score(rewards: Sequence[Any] | Mapping[Any, float], completions: Sequence[str],
          rows: Sequence[Mapping[str, Any]] | None = None) -> list[float]:
    """Total reward of every completion: ``sum_k weight_k * reward_k(completion, **row)``.

    ``rewards`` is a list of rewards (names or functions, weight 1) or a mapping reward -> weight;
    ``rows`` gives each completion's row fields (``answer``...), aligned with ``completions``.
    """
    weighted = list(rewards.items()) if isinstance(rewards, Mapping) else [(r, 1.0) for r in rewards]
    if not weighted:
        raise ValueError("score() needs at least one reward (a registered name or a function).")
    rows = list(rows) if rows is not None else [{}] * len(completions)
    if len(rows) != len(completions):
        raise ValueError(f"score(): {len(completions)} completions but {len(rows)} rows; give one row per completion.")
    fns = [(resolve("reward", r), float(w), reward_name(r)) for r, w in weighted]
    totals = []
    for index, (completion, row) in enumerate(zip(completions, rows)):
        total = 0.0
        for fn, weight, name in fns:
            try:
                value = fn(completion, **row)
            except Exception as exc:
                raise RewardError(f"Reward {name!r} raised on completion {index} ({completion[:40]!r}): "
                                  f"{type(exc).__name__}: {exc}", name, index) from exc
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"Reward {name!r} returned {value!r} for completion {index} ({completion[:40]!r}); "
                                "a reward returns a finite number.")
            total += weight * float(value)
        totals.append(total)
    return totals
