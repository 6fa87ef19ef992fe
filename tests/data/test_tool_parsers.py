"""Tool-call parsers read back what our chat templates write, and each syntax's edge cases."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from twinkle.template.qwen import QWEN2_5, QWEN3_5
from twinkle.template.tools import ClineParser, HermesQwenParser, ReActParser, ToolCallParser, ToolCallRegistry

CALLS = [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}},
    {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": [2, 3]}}},
]


def _render(chat_template: str, messages: list[dict]) -> str:
    """The chat template rendered by transformers' own renderer, as a tokenizer would render it."""
    rendered, _ = render_jinja_template([messages], chat_template=chat_template)
    return rendered[0]


@pytest.mark.parametrize("chat_template", [QWEN2_5, QWEN3_5], ids=["json_calls", "xml_calls"])
def test_hermes_reads_back_the_calls_our_qwen_templates_render(chat_template):
    messages = [{"role": "user", "content": "weather and a sum?"},
                {"role": "assistant", "content": "Let me check.", "tool_calls": CALLS}]
    rendered = _render(chat_template, messages)
    reply = rendered.rsplit("<|im_start|>assistant", 1)[1]
    parser = HermesQwenParser()
    assert parser.detect(reply) and parser.parse(reply) == CALLS
    cleaned = parser.clean(reply)
    assert "<tool_call>" not in cleaned and "Let me check." in cleaned
    assert ToolCallRegistry.detect_first(reply).name == "hermes_qwen"


def test_hermes_skips_malformed_blocks_and_reads_string_arguments():
    text = ('<tool_call>not json</tool_call><tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call>')
    assert HermesQwenParser().parse(text) == [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]


def test_react_and_cline_calls():
    react = "Thought: look it up\nAction: search[twinkle training]\nObservation: found\nAction: open[doc 1]\nok"
    assert [c["function"] for c in ReActParser().parse(react)] == [
        {"name": "search", "arguments": {"input": "twinkle training"}},
        {"name": "open", "arguments": {"input": "doc 1"}}]
    assert ReActParser().clean(react) == "Thought: look it up\nObservation: found\nok"
    cline = "<think><path>no</path></think>x <write_to_file><path>a.py</path><content>\nprint(1)\n</content>" \
            "</write_to_file>"
    assert ClineParser().parse(cline) == [{"type": "function", "function": {
        "name": "write_to_file", "arguments": {"path": "a.py", "content": "print(1)"}}}]
    assert ClineParser().clean(cline) == "<think><path>no</path></think>x"


def test_registry_order_and_errors():
    assert ToolCallRegistry.names()[:4] == ["hermes_qwen", "deepseek_dsml", "cline", "react"]
    assert ToolCallRegistry.get("react").name == "react"
    with pytest.raises(ValueError, match="named 'react' is registered already"):
        ToolCallRegistry.register(ReActParser())
    with pytest.raises(KeyError, match="No tool-call parser 'vcp'"):
        ToolCallRegistry.get("vcp")
    with pytest.raises(TypeError, match="named ToolCallParser instance"):
        ToolCallRegistry.register(ReActParser)
    assert issubclass(ClineParser, ToolCallParser)


def test_templates_parse_the_calls_of_their_own_family():
    from twinkle.template import DeepSeekV4Template, Qwen3_5Template
    from twinkle.template.deepseek import DEEPSEEK_V4
    from twinkle.template.deepseek_v4 import DeepseekV4Template

    calls = [{"type": "function", "function": {"name": "search", "arguments": {"q": "weather", "limit": 3}}}]
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "Need data.", "tool_calls": calls}]
    rendered = _render(DEEPSEEK_V4, messages)
    template = DeepseekV4Template.__new__(DeepseekV4Template)  # parsing needs no tokenizer
    assert DeepseekV4Template is DeepSeekV4Template
    reply = rendered.rsplit("Need data.", 1)[1]
    assert template.parse_tool_call("Need data." + reply) == calls == template.parse(rendered)
    assert template.clean_tool_call("Need data.\n\n" + reply.split("<｜end▁of▁sentence｜>")[0]) == "Need data."
    qwen = Qwen3_5Template.__new__(Qwen3_5Template)
    assert qwen.parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>')[0]["function"]["name"] == "f"
    assert qwen.clean("no calls here ") == "no calls here"
