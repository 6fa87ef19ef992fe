"""The tool-call parser interface: find, read and strip the tool calls a model wrote in its text."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One call in the OpenAI form the standard conversation stores: ``{'type': 'function', 'function': ...}``."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def json_or_text(value: str) -> Any:
    """``value`` decoded as JSON when it is JSON (``1`` -> 1, ``[1]`` -> [1]), else the stripped text."""
    text = value.strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


class ToolCallParser(ABC):
    """Reads one tool-call syntax out of a completion.

    ``open_marker``/``close_marker`` are the fixed strings around a call when the syntax has them (None
    otherwise), so a streaming reader can tell where a call starts.
    """

    name: ClassVar[str] = ""
    open_marker: ClassVar[str | None] = None
    close_marker: ClassVar[str | None] = None

    @abstractmethod
    def detect(self, text: str) -> bool:
        """Whether ``text`` holds at least one call in this syntax."""

    @abstractmethod
    def parse(self, text: str) -> list[dict[str, Any]]:
        """Every call of ``text`` in order, as :func:`tool_call` dicts (``[]`` for none)."""

    @abstractmethod
    def clean(self, text: str) -> str:
        """``text`` without its calls (the reply the user reads), stripped at both ends."""
