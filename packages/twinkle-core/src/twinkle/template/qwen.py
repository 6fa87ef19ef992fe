"""Qwen family templates: the tokenizer's own template, twinkle's rendering of the family's format when it has none.

The fallbacks are written from Qwen's documentation of its chat and function-calling formats, with
``{% generation %}`` around what a reply trains on:

- Qwen2.5: ChatML with Qwen's default system prompt; tools listed in the system turn inside
  ``<tools></tools>``, calls as ``<tool_call>{"name", "arguments"}</tool_call>`` JSON, tool results
  grouped in a user turn as ``<tool_response>`` blocks.
- Qwen3.5: ChatML with the thinking switch. In thinking mode the reply of the current round (after the
  last user turn) opens with ``<think>\\n`` (prompt) and trains ``reasoning\\n</think>\\n\\n`` + the
  answer; otherwise the closed ``<think>\\n\\n</think>\\n\\n`` block is prompt. Earlier rounds drop their
  reasoning, as at inference. Tool calls are Qwen3.5's XML form
  (``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from twinkle.template import chat_templates
from twinkle.template.base import Template
from twinkle.template.spans import Conversation
from twinkle.template.thinking import thinking_kwargs

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

_QWEN_TOOLS_HEAD = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>"
)
_QWEN_TOOLS_TAIL = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call>"
)

# tool results: consecutive tool turns share one user turn
_QWEN_TOOL_RESPONSE = (
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
)

# the end of an assistant turn, then tool results and user turns, to the end of the messages loop
_QWEN_TURN_END_AND_OTHER_ROLES = (
    "{{- '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- elif message.role == 'tool' -%}" + _QWEN_TOOL_RESPONSE +
    "{%- elif message.role != 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

QWEN2_5 = (
    "{%- macro call_json(call) -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endmacro -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{{- messages[0].content if messages[0].role == 'system' else '" + QWEN_DEFAULT_SYSTEM + "' -}}"
    "{%- if tools -%}{{- '\\n\\n" + _QWEN_TOOLS_HEAD + "' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '" + _QWEN_TOOLS_TAIL + "' -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message.content -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{{- ('\\n' if (message.content or not loop.first) else '') + call_json(call) -}}{%- endfor -%}"
    + _QWEN_TURN_END_AND_OTHER_ROLES +
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

QWEN3_5 = (
    "{%- set thinking = enable_thinking is not defined or enable_thinking -%}"
    "{%- macro call_xml(call) -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>\\n<function=' + fn.name + '>\\n' -}}"
    "{%- if fn.arguments is mapping -%}{%- for key, value in fn.arguments.items() -%}"
    "{{- '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) + '\\n</parameter>\\n' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '</function>\\n</tool_call>' -}}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' + ((messages[0].content + '\\n\\n') if messages[0].role == 'system' else '') -}}"
    "{{- '" + _QWEN_TOOLS_HEAD + "' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:"
    "\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n"
    "</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- set content = message.content -%}{%- set reasoning = message.reasoning_content or '' -%}"
    "{%- if not reasoning and '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- set current = loop.index0 > ns.last_query -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if current -%}{{- '<think>\\n' if thinking else '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- generation -%}"
    "{%- if current and thinking -%}{{- reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- content -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{{- ('\\n\\n' if (content and loop.first) else ('\\n' if not loop.first else '')) + call_xml(call) -}}"
    "{%- endfor -%}"
    + _QWEN_TURN_END_AND_OTHER_ROLES +
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' + ('<think>\\n' if thinking else '<think>\\n\\n</think>\\n\\n') -}}"
    "{%- endif -%}"
)


class Qwen2_5Template(Template):
    """Qwen2.5 (its template adds Qwen's default system prompt when a conversation has none)."""

    turn_end_token = "<|im_end|>"
    fallback_chat_template = QWEN2_5
    tool_call_parser = "hermes_qwen"


class Qwen3Template(Template):
    """Qwen3 thinking switch, decided per conversation unless ``enable_thinking=`` is passed.

    A conversation whose assistant turns carry reasoning (``reasoning_content``, or ``<think>`` in
    the content) renders with ``enable_thinking=True``: the ``<think>...</think>`` block is trained
    with the reply. Any other renders with ``enable_thinking=False``: the empty ``<think></think>``
    block Qwen3 puts before the last reply belongs to the prompt, as at inference, and is not trained.
    """

    turn_end_token = "<|im_end|>"
    fallback_chat_template = chat_templates.CHATML
    tool_call_parser = "hermes_qwen"
    default_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}

    def conversation_kwargs(self, conv: Conversation) -> dict[str, Any]:
        return thinking_kwargs(self.template_kwargs, self.explicit_template_kwargs, conv)


class Qwen3_5Template(Qwen3Template):
    """Qwen3.5: the Qwen3 thinking switch; without a tokenizer template, :data:`QWEN3_5` (module docstring)."""

    fallback_chat_template = QWEN3_5
