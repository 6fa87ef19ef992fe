"""Upstream Twinkle's reward objects: ``reward(trajectories, ground_truths) -> [float, ...]``.

A trajectory is a dict (or an object) with ``messages``; the completion is its last assistant turn. The
reference answer is a ``user_data`` entry ``(key, value)`` of the trajectory (upstream's rows carry
``('ground_truth', ...)`` there), else the last message of the matching ground-truth trajectory. The
scoring reuses the built-in rewards (:mod:`twinkle.reward.builtin`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from twinkle.reward.builtin import parse_number

_BOXED_OPEN = "\\boxed{"
_HASH_ANSWER = re.compile(r"####\s*([\-\d,\.\s]+)")


def _messages(trajectory: Any) -> list[Any]:
    messages = trajectory.get("messages") if isinstance(trajectory, dict) else getattr(trajectory, "messages", None)
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"A reward needs trajectories with 'messages', got {type(trajectory).__name__}: "
                         f"{trajectory!r:.80}.")
    return list(messages)


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def completion_of(trajectory: Any) -> str:
    """The content of the trajectory's last assistant message ('' when it has none)."""
    for message in reversed(_messages(trajectory)):
        if _field(message, "role") == "assistant":
            return _field(message, "content") or ""
    return ""


def user_data_of(trajectory: Any, key: str) -> Any:
    """The value of ``(key, value)`` in the trajectory's ``user_data`` (a list of pairs or a dict), else None."""
    data = trajectory.get("user_data") if isinstance(trajectory, dict) else getattr(trajectory, "user_data", None)
    if isinstance(data, dict):
        return data.get(key)
    for item in data or ():
        if isinstance(item, (list, tuple)) and len(item) == 2 and item[0] == key:
            return item[1]
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind(_BOXED_OPEN)
    if start == -1:
        return None
    depth, i = 1, start + len(_BOXED_OPEN)
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start + len(_BOXED_OPEN):i - 1].strip() if depth == 0 else None


class Reward:
    """Base of reward objects: one float per trajectory."""

    def __call__(self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} scores nothing; subclass Reward and define __call__.")


class GSM8KAccuracyReward(Reward):
    """1.0 when the completion's answer (its last ``\\boxed{}``, else its last ``#### n``) equals the ground
    truth numerically (exactly, fractions and thousands separators read), else 0.0.

    Args:
        ground_truth_key: the ``user_data`` key of the reference answer.
    """

    def __init__(self, ground_truth_key: str = "ground_truth") -> None:
        self.ground_truth_key = ground_truth_key

    @staticmethod
    def extract_answer(completion: str) -> str:
        """The answer text a GSM8K completion gives ('' when none)."""
        boxed = last_boxed(completion)
        if boxed:
            return boxed.replace(",", "").replace(" ", "")
        found = _HASH_ANSWER.findall(completion)
        return found[-1].replace(",", "").replace(" ", "").strip() if found else ""

    def __call__(self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        rewards = []
        for index, trajectory in enumerate(trajectories):
            expected = _reference(trajectory, ground_truths, index, self.ground_truth_key, type(self).__name__)
            got, want = parse_number(self.extract_answer(completion_of(trajectory))), parse_number(str(expected))
            rewards.append(float(got is not None and want is not None and got == want))
        return rewards


class GSM8KFormatReward(Reward):
    """1.0 when the completion states an answer as ``\\boxed{...}`` or ``#### n``, else 0.0."""

    def __call__(self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        return [float(bool(last_boxed(text) or _HASH_ANSWER.search(text)))
                for text in map(completion_of, trajectories)]


class FormatReward(Reward):
    """1.0 when the completion has a ``<think>...</think>`` and an ``<answer>...</answer>`` block, else 0.0.

    (The ``format_match`` function is stricter: the whole completion must be think then answer.)
    """

    @staticmethod
    def format_reward(completion: str) -> float:
        """The reward of one completion."""
        return float(bool(re.search(r"<think>.*?</think>", completion, re.DOTALL)
                          and re.search(r"<answer>.*?</answer>", completion, re.DOTALL)))

    def __call__(self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        return [self.format_reward(completion_of(t)) for t in trajectories]


class MathReward(Reward):
    """1.0 when the completion's final answer (after ``# Answer``, its last ``\\boxed{}``) equals the reference's.

    Answers compare as exact numbers when both read as one (``1/2`` = ``0.5``), else as their text with
    LaTeX delimiters and braces removed. (Upstream also compares symbolically with sympy, which this
    does not use: ``\\frac{1}{2}`` and ``0.5`` compare equal only through the number reading.)

    Args:
        ground_truth_key: the ``user_data`` key of the reference; else the ground-truth trajectory's last message.
    """

    def __init__(self, ground_truth_key: str = "solution") -> None:
        self.ground_truth_key = ground_truth_key

    @staticmethod
    def final_answer(text: str) -> str:
        """What a solution answers: the part after ``# Answer``, its last ``\\boxed{}`` content if any."""
        text = text.split("# Answer")[1] if "# Answer" in text else text
        return last_boxed(text) or text.strip()

    @staticmethod
    def clean_latex(text: str) -> str:
        """The text without ``\\( \\) \\[ \\]`` and braces."""
        return re.sub(r"\\\(|\\\)|\\\[|\\\]|[{}]", "", text).strip()

    def __call__(self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        rewards = []
        for index, trajectory in enumerate(trajectories):
            expected = _reference(trajectory, ground_truths, index, self.ground_truth_key, type(self).__name__)
            got, want = self.final_answer(completion_of(trajectory)), self.final_answer(str(expected))
            rewards.append(float(_same_answer(got, want)))
        return rewards


def _same_answer(got: str, want: str) -> bool:
    got_text, want_text = MathReward.clean_latex(got), MathReward.clean_latex(want)
    got_number = parse_number(got_text) if re.fullmatch(r"[\s\d.,/\-]+", got_text) else None
    want_number = parse_number(want_text) if re.fullmatch(r"[\s\d.,/\-]+", want_text) else None
    if got_number is not None and want_number is not None:
        return got_number == want_number
    return got_text.replace(" ", "") == want_text.replace(" ", "")


def _reference(trajectory: Any, ground_truths: Sequence[Any] | None, index: int, key: str, name: str) -> Any:
    value = user_data_of(trajectory, key)
    if value is None and ground_truths is not None:
        if index >= len(ground_truths):
            raise ValueError(f"{name}: {len(ground_truths)} ground truths for more trajectories; give one each.")
        truth = ground_truths[index]
        value = user_data_of(truth, key) if not isinstance(truth, str) else truth
        if value is None and not isinstance(truth, str):
            messages = _messages(truth)
            value = _field(messages[-1], "content") if messages else None
    if value is None:
        raise ValueError(f"{name}: trajectory {index} has no reference answer: give it a user_data entry "
                         f"({key!r}, answer) or pass ground_truths=.")
    return value
