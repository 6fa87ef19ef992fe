"""Scoring completions with several rewards, and registering a reward from a script."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twinkle.registry import register, resolve

RewardFn = Callable[..., float]


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
    fns = [(resolve("reward", r), float(w), r) for r, w in weighted]
    totals = []
    for completion, row in zip(completions, rows):
        total = 0.0
        for fn, weight, name in fns:
            value = fn(completion, **row)
            if not isinstance(value, (int, float)) or value != value:
                raise TypeError(f"Reward {name!r} returned {value!r} for {completion[:40]!r}; a reward returns a "
                                "number.")
            total += weight * float(value)
        totals.append(total)
    return totals
