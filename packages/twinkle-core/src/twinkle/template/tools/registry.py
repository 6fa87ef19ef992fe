"""ToolCallRegistry: the parsers in the order they are tried, the first that detects a call owns the text."""

from __future__ import annotations

from typing import ClassVar

from twinkle.template.tools.base import ToolCallParser
from twinkle.template.tools.cline import ClineParser
from twinkle.template.tools.dsml import DSMLParser
from twinkle.template.tools.hermes import HermesQwenParser
from twinkle.template.tools.react import ReActParser


class ToolCallRegistry:
    """Parsers by name, tried in registration order: fixed-marker syntaxes (Hermes) before free-form ones.

    ``detect_first(text)`` returns the first parser that detects a call, so a text is read by one syntax
    only (a Hermes block is not read again as Cline XML).
    """

    _parsers: ClassVar[dict[str, ToolCallParser]] = {}

    @classmethod
    def register(cls, parser: ToolCallParser, *, override: bool = False) -> ToolCallParser:
        """Add a parser (tried after those already registered); a taken name needs ``override=True``."""
        if not isinstance(parser, ToolCallParser) or not parser.name:
            raise TypeError(f"ToolCallRegistry.register takes a named ToolCallParser instance, got {parser!r}.")
        if parser.name in cls._parsers and not override:
            raise ValueError(f"A tool-call parser named {parser.name!r} is registered already; pass override=True "
                             "to replace it.")
        cls._parsers[parser.name] = parser
        return parser

    @classmethod
    def get(cls, name: str) -> ToolCallParser:
        """The parser named ``name``."""
        if name not in cls._parsers:
            raise KeyError(f"No tool-call parser {name!r}; registered: {', '.join(cls._parsers)}.")
        return cls._parsers[name]

    @classmethod
    def names(cls) -> list[str]:
        """The registered parsers' names in the order they are tried."""
        return list(cls._parsers)

    @classmethod
    def detect_first(cls, text: str) -> ToolCallParser | None:
        """The first parser that detects a call in ``text``, or None."""
        return next((p for p in cls._parsers.values() if p.detect(text or "")), None)


for _parser in (HermesQwenParser(), DSMLParser(), ClineParser(), ReActParser()):
    ToolCallRegistry.register(_parser)
