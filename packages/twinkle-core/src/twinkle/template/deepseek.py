"""DeepSeek templates: R1 (reasoning, V3 tool tokens) and V4 (thinking switch, DSML tool calls).

Written from DeepSeek's published formats, with ``{% generation %}`` around what a reply trains on.

**DeepSeek-R1**: ``<｜begin▁of▁sentence｜>{system}<｜User｜>{query}<｜Assistant｜><think>\\n`` then the
reply ``{reasoning}\\n</think>\\n\\n{answer}<｜end▁of▁sentence｜>``. Only the current round (after the
last user turn) shows its reasoning; earlier replies are their answers alone, as the model sees its
history at inference. Tool calls use the V3 tool tokens
(``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>...``),
tool results ``<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>...<｜tool▁output▁end｜><｜tool▁outputs▁end｜>``,
after which the reply follows without a new ``<｜Assistant｜>``.

**DeepSeek-V4** (its ``encoding_dsv4`` rules): the tool list goes into the system turn as a
``## Tools`` section; a user turn is ``<｜User｜>`` + text, tool results become
``<tool_result>...</tool_result>`` blocks of a user turn (consecutive user/tool turns merge, joined
by blank lines); the assistant turn opens with ``<｜Assistant｜>`` followed by ``<think>`` (thinking
mode, current round) or ``</think>`` (chat mode, or an earlier round whose reasoning is dropped); a
reply is ``[reasoning</think>]{content}[\\n\\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>]<｜end▁of▁sentence｜>``.
A call is ``<｜DSML｜invoke name="NAME">`` with one ``<｜DSML｜parameter name="KEY" string="true|false">``
per argument: strings as they are (``string="true"``), anything else as JSON. When the conversation
has tools, no reasoning is dropped. ``reasoning_effort='max'`` adds DeepSeek's maximum-effort
preamble in thinking mode.
"""

from __future__ import annotations

from typing import Any, ClassVar

from twinkle.template.base import Template
from twinkle.template.spans import Conversation
from twinkle.template.thinking import thinking_kwargs

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
DSML = "｜DSML｜"

DEEPSEEK_R1 = (
    "{%- macro calls(message) -%}"
    "{{- '<｜tool▁calls▁begin｜>' -}}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- ('\\n' if not loop.first else '') + '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + fn.name -}}"
    "{{- '\\n```json\\n' + (fn.arguments if fn.arguments is string else fn.arguments | tojson) -}}"
    "{{- '\\n```<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}"
    "{{- '<｜tool▁calls▁end｜>' -}}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{- '" + BOS + "' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{{- '" + USER + "' + message.content -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if messages[loop.index0 - 1].role != 'tool' -%}{{- '<｜tool▁outputs▁begin｜>' -}}"
    "{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<｜tool▁output▁begin｜>' + message.content + '<｜tool▁output▁end｜>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = message.content -%}{%- set reasoning = message.reasoning_content or '' -%}"
    "{%- if not reasoning and '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- set after_tools = messages[loop.index0 - 1].role == 'tool' -%}"
    "{%- set current = loop.index0 > ns.last_user and not after_tools -%}"
    "{%- if not after_tools -%}{{- '" + ASSISTANT + "' -}}{%- endif -%}"
    "{%- if current -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- generation -%}"
    "{%- if current -%}{{- reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- content -}}{%- if message.tool_calls -%}{{- calls(message) -}}{%- endif -%}"
    "{{- '" + EOS + "' -}}{%- endgeneration -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and messages[-1].role != 'tool' -%}{{- '" + ASSISTANT + "<think>\\n' -}}"
    "{%- endif -%}"
)

_V4_TOOLS = (
    "## Tools\\n\\nYou have access to a set of tools to help answer the user\\'s question. You can invoke tools by "
    "writing a \"<" + DSML + "tool_calls>\" block like the following:\\n\\n<" + DSML + "tool_calls>\\n<" + DSML
    + "invoke name=\"$TOOL_NAME\">\\n<" + DSML + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</" + DSML + "parameter>\\n...\\n</" + DSML + "invoke>\\n<" + DSML
    + "invoke name=\"$TOOL_NAME2\">\\n...\\n</" + DSML + "invoke>\\n</" + DSML + "tool_calls>\\n\\nString "
    "parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\\n\\nIf thinking_mode is "
    "enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE "
    "any tool calls or final response.\\n\\nOtherwise, output directly after </think> with tool calls or final "
    "response.\\n\\n### Available Tool Schemas\\n\\n"
)
_V4_TOOLS_TAIL = (
    "\\n\\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\\n"
)
_V4_MAX_EFFORT = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\\nYou MUST be very thorough in your "
    "thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing "
    "your logic against all potential paths, edge cases, and adversarial scenarios.\\nExplicitly write out your "
    "entire deliberation process, documenting every intermediate step, considered alternative, and rejected "
    "hypothesis to ensure absolutely no assumption is left unchecked.\\n\\n"
)

DEEPSEEK_V4 = (
    "{%- set thinking = enable_thinking is defined and enable_thinking -%}"
    "{%- set keep_all = tools is defined and tools -%}"
    "{%- macro invoke(call) -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- set args = fn.arguments if fn.arguments is mapping else {'arguments': fn.arguments} -%}"
    "{{- '<" + DSML + "invoke name=\"' + fn.name + '\">\\n' -}}"
    "{%- for key, value in args.items() -%}"
    "{{- ('\\n' if not loop.first else '') + '<" + DSML + "parameter name=\"' + key + '\" string=\"' -}}"
    "{{- ('true\">' + value) if value is string else ('false\">' + (value | tojson)) -}}"
    "{{- '</" + DSML + "parameter>' -}}"
    "{%- endfor -%}"
    "{{- '\\n</" + DSML + "invoke>' -}}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}{%- if message.role in ['user', 'tool'] -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{{- '" + BOS + "' -}}"
    "{%- if thinking and reasoning_effort is defined and reasoning_effort == 'max' -%}"
    "{{- '" + _V4_MAX_EFFORT + "' -}}{%- endif -%}"
    "{%- if messages[0].role == 'system' or tools -%}"
    "{{- messages[0].content if messages[0].role == 'system' else '' -}}"
    "{%- if tools -%}{{- '\\n\\n" + _V4_TOOLS + "' -}}"
    "{%- for tool in tools -%}{{- ('\\n' if not loop.first else '') + "
    "((tool.function if tool.function is defined else tool) | tojson) -}}{%- endfor -%}"
    "{{- '" + _V4_TOOLS_TAIL + "' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set prev = messages[loop.index0 - 1].role if not loop.first else 'system' -%}"
    "{%- if message.role in ['user', 'tool'] -%}"
    "{{- ('\\n\\n' if prev in ['user', 'tool'] else '" + USER + "') -}}"
    "{{- ('<tool_result>' + message.content + '</tool_result>') if message.role == 'tool' else message.content -}}"
    "{%- if (loop.last and add_generation_prompt) or (not loop.last and messages[loop.index0 + 1].role == "
    "'assistant') -%}"
    "{{- '" + ASSISTANT + "' + ('<think>' if thinking and (keep_all or loop.index0 >= ns.last_user) "
    "else '</think>') -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- generation -%}"
    "{%- if thinking and (keep_all or loop.index0 > ns.last_user) -%}"
    "{{- (message.reasoning_content or '') + '</think>' -}}{%- endif -%}"
    "{{- message.content -}}"
    "{%- if message.tool_calls -%}"
    "{{- '\\n\\n<" + DSML + "tool_calls>\\n' -}}"
    "{%- for call in message.tool_calls -%}{{- ('\\n' if not loop.first else '') + invoke(call) -}}{%- endfor -%}"
    "{{- '\\n</" + DSML + "tool_calls>' -}}"
    "{%- endif -%}"
    "{{- '" + EOS + "' -}}{%- endgeneration -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


class DeepSeekR1Template(Template):
    """DeepSeek-R1 (module docstring): reasoning of the current round trained as ``...\\n</think>\\n\\n`` + answer."""

    turn_end_token = EOS
    fallback_chat_template = DEEPSEEK_R1


class DeepSeekV4Template(Template):
    """DeepSeek-V4 (module docstring): DSML tool calls; thinking mode per conversation unless ``enable_thinking=``.

    ``DeepseekV4Template`` (in ``twinkle.template.deepseek_v4``) is upstream Twinkle's spelling.

    Its repositories ship the format as Python (``encoding_dsv4.py``), not as a chat template, so this
    template always renders :data:`DEEPSEEK_V4` (pass ``chat_template=`` to use another).
    """

    turn_end_token = EOS
    forced_chat_template = DEEPSEEK_V4
    tool_call_parser = "deepseek_dsml"
    default_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}

    def conversation_kwargs(self, conv: Conversation) -> dict[str, Any]:
        return thinking_kwargs(self.template_kwargs, self.explicit_template_kwargs, conv)
