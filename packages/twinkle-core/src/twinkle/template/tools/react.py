"""ReAct calls: ``Action: tool_name[input]`` lines between Thought / Observation lines."""

from __future__ import annotations

import re
from typing import Any

from twinkle.template.tools.base import ToolCallParser, tool_call

_ACTION = re.compile(r"^[ \t]*Action:[ \t]*([A-Za-z_][\w.\-]*)[ \t]*\[(.*?)\][ \t]*$", re.MULTILINE)
_ACTION_LINE = re.compile(r"^[ \t]*Action:[ \t]*[A-Za-z_][\w.\-]*[ \t]*\[.*?\][ \t]*(?:\n|$)", re.MULTILINE)


class ReActParser(ToolCallParser):
    """Each ``Action: name[input]`` line is a call with ``{'input': input}`` (Yao et al. 2023's format)."""

    name = "react"

    def detect(self, text: str) -> bool:
        return bool(_ACTION.search(text or ""))

    def parse(self, text: str) -> list[dict[str, Any]]:
        return [tool_call(name, {"input": argument}) for name, argument in _ACTION.findall(text or "")]

    def clean(self, text: str) -> str:
        return _ACTION_LINE.sub("", text or "").strip()
