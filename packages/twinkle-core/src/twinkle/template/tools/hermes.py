"""Hermes / Qwen calls: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` or Qwen3.5's XML body."""

from __future__ import annotations

import json
import re
from typing import Any

from twinkle.template.tools.base import ToolCallParser, json_or_text, tool_call

#: a block; a truncated last one (no closing tag) runs to the end of the text
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


class HermesQwenParser(ToolCallParser):
    """``<tool_call>`` blocks holding JSON (Hermes, Qwen2.5/3) or ``<function=NAME><parameter=K>V</parameter>``
    (Qwen3.5, Qwen3-Coder); parameter values are JSON-decoded when they are JSON. A block that is neither is
    skipped (a model's malformed call is not a call)."""

    name = "hermes_qwen"
    open_marker = "<tool_call>"
    close_marker = "</tool_call>"

    def detect(self, text: str) -> bool:
        return bool(text) and self.open_marker in text

    def parse(self, text: str) -> list[dict[str, Any]]:
        calls = []
        for block in _BLOCK.findall(text or ""):
            call = self._json_call(block) or self._xml_call(block)
            if call is not None:
                calls.append(call)
        return calls

    def clean(self, text: str) -> str:
        return _BLOCK.sub("", text or "").strip()

    @staticmethod
    def _json_call(body: str) -> dict[str, Any] | None:
        try:
            data = json.loads(body.strip())
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json_or_text(arguments)
        return tool_call(data["name"], arguments)

    @staticmethod
    def _xml_call(body: str) -> dict[str, Any] | None:
        found = _FUNCTION.search(body)
        if found is None:
            return None
        arguments = {key: json_or_text(value) for key, value in _PARAMETER.findall(found.group(2))}
        return tool_call(found.group(1), arguments)
