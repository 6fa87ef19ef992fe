"""Cline calls: the tool's name as an XML tag around one tag per argument, ``<read_file><path>a</path></read_file>``."""

from __future__ import annotations

import re
from typing import Any

from twinkle.template.tools.base import ToolCallParser, tool_call

_BLOCK = re.compile(r"<([A-Za-z_][\w\-]*)>(.*?)</\1>", re.DOTALL)
#: tags that are markup, reasoning or another syntax's call, never a Cline tool
NOT_TOOLS = frozenset({"tool_call", "think", "thinking", "answer", "code", "pre", "p", "div", "span", "b", "i",
                       "em", "strong", "ul", "ol", "li", "table", "tr", "td", "th", "html", "body", "head",
                       "br", "a", "img", "h1", "h2", "h3", "h4", "h5", "h6", "tools", "tool_response"})


class ClineParser(ToolCallParser):
    """A tag not in :data:`NOT_TOOLS` whose content is argument tags ``<key>value</key>`` is a call; argument
    values are the stripped text (Cline's tools read strings). Blocks are found left to right without
    overlap, so the tags inside a skipped block (a ``<think>``) are not read as calls either."""

    name = "cline"

    def detect(self, text: str) -> bool:
        return any(True for _ in self._calls(text or ""))

    def parse(self, text: str) -> list[dict[str, Any]]:
        return [tool_call(name, arguments) for name, arguments, _ in self._calls(text or "")]

    def clean(self, text: str) -> str:
        text = text or ""
        spans = [span for _, _, span in self._calls(text)]
        for start, end in reversed(spans):
            text = text[:start] + text[end:]
        return text.strip()

    @staticmethod
    def _calls(text: str):
        for block in _BLOCK.finditer(text):
            name, body = block.group(1), block.group(2)
            if name.lower() in NOT_TOOLS:
                continue
            arguments = {key: value.strip() for key, value in _BLOCK.findall(body)}
            if arguments:
                yield name, arguments, block.span()
