"""Preprocessors: raw dataset rows -> the standard conversation format (see ``preprocessor.messages``).

Registered by name (``Dataset.map('AlpacaProcessor')``) through the plugin registry.
"""

from __future__ import annotations

from twinkle.preprocessor.alpaca import AlpacaProcessor
from twinkle.preprocessor.base import Preprocessor
from twinkle.preprocessor.competition_math import CompetitionMathGRPOProcessor, CompetitionMathProcessor
from twinkle.preprocessor.conversation import MessagesProcessor
from twinkle.preprocessor.messages import check_messages, standard_row
from twinkle.preprocessor.self_cognition import SelfCognitionProcessor

__all__ = [
    "AlpacaProcessor",
    "CompetitionMathGRPOProcessor",
    "CompetitionMathProcessor",
    "MessagesProcessor",
    "Preprocessor",
    "SelfCognitionProcessor",
    "check_messages",
    "standard_row",
]
