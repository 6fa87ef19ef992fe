"""Argument checks shared by every component, so one kind of bad value gets one kind of message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def check_int(value: Any, name: str, minimum: int = 1, hint: str = "") -> int:
    """``value`` if it is an int (a bool is not) of at least ``minimum``; else a ValueError naming ``name``.

    ``hint`` follows the bound in the message, e.g. ``" (skipped steps in a row before training stops)"``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{hint}, got {value!r}.")
    return value


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; else a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}.")
    return value


def check_no_kwargs(method: str, kwargs: Mapping[str, Any]) -> None:
    """A TwinkleModel method that took its known keywords out of ``kwargs`` refuses the rest, naming them."""
    if kwargs:
        raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}.")
