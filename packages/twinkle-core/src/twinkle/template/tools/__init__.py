"""Parsers of the tool calls a model writes in its completion (Hermes/Qwen, DSML, ReAct, Cline), by upstream's names.

Each returns calls in the standard conversation's form, ``{'type': 'function', 'function': {'name', 'arguments'}}``,
so a parsed completion becomes an assistant turn's ``tool_calls``.
"""

from twinkle.template.tools.base import ToolCallParser, tool_call
from twinkle.template.tools.cline import ClineParser
from twinkle.template.tools.dsml import DSMLParser
from twinkle.template.tools.hermes import HermesQwenParser
from twinkle.template.tools.react import ReActParser
from twinkle.template.tools.registry import ToolCallRegistry

__all__ = ["ClineParser", "DSMLParser", "HermesQwenParser", "ReActParser", "ToolCallParser", "ToolCallRegistry",
           "tool_call"]
