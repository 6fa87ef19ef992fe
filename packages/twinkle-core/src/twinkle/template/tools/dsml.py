"""DeepSeek-V4's DSML calls: ``<｜DSML｜tool_calls>`` around ``<｜DSML｜invoke name=...>`` with typed parameters."""

from __future__ import annotations

import re
from typing import Any

from twinkle.template.tools.base import ToolCallParser, json_or_text, tool_call

DSML = "｜DSML｜"
_BLOCK = re.compile(rf"\s*<{DSML}tool_calls>(.*?)(?:</{DSML}tool_calls>|\Z)", re.DOTALL)
_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]+)">(.*?)(?:</{DSML}invoke>|\Z)', re.DOTALL)
_PARAMETER = re.compile(rf'<{DSML}parameter name="([^"]+)" string="(true|false)">(.*?)</{DSML}parameter>', re.DOTALL)


class DSMLParser(ToolCallParser):
    """A parameter with ``string="true"`` is its text as written; ``string="false"`` is JSON (numbers, lists...),
    as :class:`~twinkle.template.DeepSeekV4Template` renders them."""

    name = "deepseek_dsml"
    open_marker = f"<{DSML}tool_calls>"
    close_marker = f"</{DSML}tool_calls>"

    def detect(self, text: str) -> bool:
        return bool(text) and self.open_marker in text

    def parse(self, text: str) -> list[dict[str, Any]]:
        calls = []
        for block in _BLOCK.findall(text or ""):
            for name, body in _INVOKE.findall(block):
                arguments = {key: value if is_string == "true" else json_or_text(value)
                             for key, is_string, value in _PARAMETER.findall(body)}
                calls.append(tool_call(name, arguments))
        return calls

    def clean(self, text: str) -> str:
        return _BLOCK.sub("", text or "").strip()
