"""CompetitionMathProcessor / CompetitionMathGRPOProcessor: ``problem``/``solution`` rows (competition_math).

The SFT form trains the solution as the reply; the GRPO form is a prompt for generation (a system turn
asking for a ``\\boxed{}`` answer, an empty assistant turn) with the solution kept in ``user_data`` as
``('solution', text)``, where :class:`twinkle.reward.MathReward` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.preprocessor.base import Preprocessor
from twinkle.preprocessor.messages import message_features, standard_row

#: upstream Twinkle's system turn for competition_math prompts
GRPO_SYSTEM = ("You are a helpful math assistant. Respond with only the final answer in the form "
               "\\boxed{...} and nothing else.")


class CompetitionMathProcessor(Preprocessor):
    """``problem`` is the user turn, ``solution`` the assistant's reply."""

    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any]:
        messages = [{"role": "user", "content": self.field(row, "problem")},
                    {"role": "assistant", "content": self.field(row, "solution")}]
        return standard_row(messages)


class CompetitionMathGRPOProcessor(Preprocessor):
    """A generation prompt for ``problem``; ``solution`` goes to ``user_data`` for the reward.

    Args:
        system: the system turn (upstream Twinkle's, asking for a ``\\boxed{}`` answer, by default).
    """

    def __init__(self, system: str = GRPO_SYSTEM) -> None:
        self.system = system

    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system},
                    {"role": "user", "content": self.field(row, "problem")},
                    {"role": "assistant", "content": ""}]
        return {**standard_row(messages), "user_data": [("solution", self.field(row, "solution"))]}

    def output_features(self) -> Any:
        import datasets

        return datasets.Features({**message_features(), "user_data": [[datasets.Value("string")]]})
