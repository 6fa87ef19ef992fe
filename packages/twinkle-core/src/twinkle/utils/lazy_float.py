"""LazyFloat: a number that reads its device tensors only when someone looks at it.

``forward_backward`` returns the micro-batch's loss. Converting it to a Python float right away
would make the host wait for the device after every micro-batch, which stalls the queue of GPU
work; a LazyFloat keeps the device tensors and converts once, on first use (``float(x)``,
arithmetic, comparison, formatting, printing). Pickling gives a plain ``float``, so results sent
through Ray or ``torch.save`` are ordinary numbers. ``json.dumps`` needs ``float(x)``.
"""

from __future__ import annotations

import numbers
from typing import Any


def _number(value: Any) -> float:
    if hasattr(value, "detach"):
        value = value.detach()
    return float(value)


class LazyFloat:
    """``numerator / max(denominator, 1)`` of numbers or one-element tensors, computed on first use."""

    __slots__ = ("_parts", "_value")

    def __init__(self, numerator: Any, denominator: Any = 1) -> None:
        self._parts: tuple[Any, Any] | None = (numerator, denominator)
        self._value: float | None = None

    def __float__(self) -> float:
        if self._value is None:
            numerator, denominator = self._parts
            self._value = _number(numerator) / max(_number(denominator), 1.0)
            self._parts = None  # release the device tensors
        return self._value

    def item(self) -> float:
        """The value as a Python float (as ``torch.Tensor.item``)."""
        return float(self)

    # ---------------------------------------------------------------- protocols
    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return float, (float(self),)

    def __repr__(self) -> str:
        return repr(float(self))

    def __format__(self, spec: str) -> str:
        return format(float(self), spec)

    def __hash__(self) -> int:
        return hash(float(self))

    def __bool__(self) -> bool:
        return bool(float(self))

    def __int__(self) -> int:
        return int(float(self))

    def __round__(self, ndigits: int | None = None) -> Any:
        return round(float(self), ndigits)

    def as_integer_ratio(self) -> tuple[int, int]:
        return float(self).as_integer_ratio()

    def is_integer(self) -> bool:
        return float(self).is_integer()

    def __neg__(self) -> float:
        return -float(self)

    def __pos__(self) -> float:
        return float(self)

    def __abs__(self) -> float:
        return abs(float(self))


def _binary(name: str) -> Any:
    op = getattr(float, name)

    def method(self: LazyFloat, other: Any) -> Any:
        if isinstance(other, LazyFloat):
            other = float(other)
        return op(float(self), other)

    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__",
              "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__",
              "__mod__", "__rmod__", "__pow__", "__rpow__"):
    setattr(LazyFloat, _name, _binary(_name))
numbers.Real.register(LazyFloat)
