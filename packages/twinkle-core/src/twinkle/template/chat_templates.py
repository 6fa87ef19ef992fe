"""Chat templates twinkle falls back on when a tokenizer has none (base models), with {% generation %} markers.

They render what the model families' own templates render for plain conversations.
"""

from __future__ import annotations

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- message['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Llama 3.1-3.3 instruct: a system turn with the knowledge/today dates (``date_string``), custom tools listed in the
# first user turn (``tools_in_user_message``, default) or the system turn, one JSON call per assistant turn,
# tool results as ``ipython`` turns.
_LLAMA3_TOOLS_HINT = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\\n\\nRespond in the format {\"name\": function name, \"parameters\": dictionary "
    "of argument name and its value}.Do not use variables.\\n\\n"
)
LLAMA3 = (
    "{%- set in_user = tools_in_user_message if tools_in_user_message is defined else true -%}"
    "{%- set today = date_string if date_string is defined else '26 Jul 2024' -%}"
    "{%- macro tool_list() -%}{%- for tool in tools -%}{{- (tool | tojson(indent=4)) + '\\n\\n' -}}{%- endfor -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + today + '\\n\\n' -}}"
    "{%- if tools and not in_user -%}{{- '" + _LLAMA3_TOOLS_HINT + "' + tool_list() -}}{%- endif -%}"
    "{{- (messages[0].content | trim if messages[0].role == 'system' else '') + '<|eot_id|>' -}}"
    "{%- set ns = namespace(tools_pending=tools and in_user) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- generation -%}"
    "{%- if message.tool_calls -%}"
    "{%- if message.tool_calls | length > 1 -%}"
    "{{- raise_exception('Llama 3 calls one tool per assistant turn.') -}}{%- endif -%}"
    "{%- set fn = message.tool_calls[0].function if message.tool_calls[0].function is defined "
    "else message.tool_calls[0] -%}"
    "{{- '{\"name\": \"' + fn.name + '\", \"parameters\": ' + (fn.arguments | tojson) + '}' -}}"
    "{%- else -%}{{- message.content | trim -}}{%- endif -%}"
    "{{- '<|eot_id|>' -}}{%- endgeneration -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' -}}"
    "{%- elif message.role == 'user' -%}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}"
    "{%- if ns.tools_pending -%}{{- '" + _LLAMA3_TOOLS_HINT + "' + tool_list() -}}"
    "{%- set ns.tools_pending = false -%}{%- endif -%}"
    "{{- message.content | trim + '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)


def _render_macro(image: str, video: str) -> str:
    """A ``render(content)`` macro: text as it is, an image or video part as the family's placeholder text."""
    return ("{%- macro render(content) -%}"
            "{%- if content is string -%}{{- content -}}"
            "{%- else -%}{%- for part in content -%}"
            "{%- if part['type'] == 'image' -%}{{- '" + image + "' -}}"
            "{%- elif part['type'] == 'video' -%}{{- '" + video + "' -}}"
            "{%- else -%}{{- part['text'] -}}{%- endif -%}"
            "{%- endfor -%}{%- endif -%}"
            "{%- endmacro -%}")


# ChatML turns whose content goes through a ``render`` macro (text, or a list of text and media parts)
_CHATML_RENDERED_TURNS = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- render(message['content']) + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- render(message['content']) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen-VL conversation format (ChatML; image/video parts become the vision placeholder tokens).
QWEN_VL = (
    _render_macro(image="<|vision_start|><|image_pad|><|vision_end|>",
                  video="<|vision_start|><|video_pad|><|vision_end|>")
    + _CHATML_RENDERED_TURNS
)

# InternVL 2.5 conversation format (its "internvl2_5" template: ChatML with InternVL's default system prompt when
# the conversation has none). An image part becomes the context placeholder on its own line; the processor
# expands it into <img> + <IMG_CONTEXT> x (tiles x tokens per tile) + </img>.
INTERNVL2_5_SYSTEM = ("你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的"
                      "多模态大语言模型。")
INTERNVL2_5 = (
    _render_macro(image="<IMG_CONTEXT>\\n", video="<video>\\n") +
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + INTERNVL2_5_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    + _CHATML_RENDERED_TURNS
)
