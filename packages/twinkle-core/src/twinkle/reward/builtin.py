"""The built-in verifiable rewards. Each returns 1.0 or 0.0 and ignores row fields it does not use."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
#: DeepSeek-R1's reasoning format: a think block, then an answer block
R1_FORMAT = r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"


def _answer(answer: Any, name: str) -> str:
    if answer is None:
        raise ValueError(f"{name} needs the row's reference answer: give the row an 'answer' field.")
    return str(answer)


def exact_match(completion: str, answer: Any = None, *, strip: bool = True, **row: Any) -> float:
    """1.0 when the completion equals the answer (surrounding whitespace ignored with ``strip``)."""
    expected = _answer(answer, "exact_match")
    if strip:
        completion, expected = completion.strip(), expected.strip()
    return float(completion == expected)


def parse_number(text: str) -> Fraction | None:
    """The number a text ends with: the content of the last ``\\boxed{}`` if any, else the last number.

    Thousands separators are dropped; ``a/b`` fractions and decimals are read exactly.
    """
    boxed = _BOXED.findall(text)
    candidates = _NUMBER.findall(boxed[-1] if boxed else text)
    if not candidates:
        return None
    try:
        return Fraction(candidates[-1].replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def numeric_match(completion: str, answer: Any = None, *, tolerance: float = 1e-6, **row: Any) -> float:
    """1.0 when the completion's final number equals the answer's (within ``tolerance``, relative to 1 or |answer|)."""
    expected = parse_number(_answer(answer, "numeric_match"))
    if expected is None:
        raise ValueError(f"numeric_match: the answer {answer!r} holds no number.")
    got = parse_number(completion)
    if got is None:
        return 0.0
    return float(abs(float(got - expected)) <= tolerance * max(1.0, abs(float(expected))))


def format_match(completion: str, pattern: str = R1_FORMAT, **row: Any) -> float:
    """1.0 when the whole completion matches ``pattern`` (a regex; ``.`` matches newlines)."""
    return float(re.fullmatch(pattern, completion, flags=re.DOTALL) is not None)
