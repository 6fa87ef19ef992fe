"""Templates of the other supported language families: Mistral, Yi, GLM-4, InternLM2.5.

Each renders the family's published conversation format (twinkle's own Jinja, used when the
tokenizer brings no chat template), with ``{% generation %}`` around what a reply trains on.

- **Mistral** (v3 tokenizer, Mistral-7B-Instruct-v0.3): ``<s>[INST] {user}[/INST] {reply}</s>``; the
  system prompt is prepended to the last user turn, the tool list (``[AVAILABLE_TOOLS] [...]
  [/AVAILABLE_TOOLS]``) put before it; calls are ``[TOOL_CALLS] [{"name", "arguments"}]</s>``, results
  ``[TOOL_RESULTS] {"content": ...}[/TOOL_RESULTS]``. A reply trains `` {reply}</s>`` (the leading
  space is the model's).
- **Yi** (Yi-1.5 chat): the system text first, bare; ``<|im_start|>user\\n{user}<|im_end|>\\n
  <|im_start|>assistant\\n`` after every user turn; replies ``{reply}<|im_end|>\\n``. Yi documents no
  tool format: tools or tool turns are refused.
- **GLM-4** (glm-4-9b-chat): ``[gMASK]<sop>``, then ``<|system|>\\n``, ``<|user|>\\n``,
  ``<|assistant|>\\n``, ``<|observation|>\\n`` turns with no end token: a reply ends where the model emits
  the next role token (``<|user|>``, ``<|observation|>``), or ``<|endoftext|>`` at the end, and that
  token is trained with it (the next turn does not repeat it). A call is ``<|assistant|>NAME\\n{arguments
  JSON}``; the tool list goes into a system turn as GLM-4 lists it.
- **InternLM2.5** (internlm2_5-chat): ``<s>`` + ChatML; tools in a ``<|im_start|>system name=<|plugin|>``
  turn, calls ``<|action_start|><|plugin|>\\n{"name", "parameters"}<|action_end|>`` at the end of the
  reply, results in ``<|im_start|>environment name=<|plugin|>`` turns.
"""

from __future__ import annotations

from twinkle.template.base import Template

MISTRAL = (
    "{%- set system = messages[0].content if messages[0].role == 'system' else '' -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{- '<s>' -}}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}"
    "{%- if tools and loop.index0 == ns.last_user -%}"
    "{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}"
    "{{- '[INST] ' + ((system + '\\n\\n') if system and loop.index0 == ns.last_user else '') + message.content -}}"
    "{{- '[/INST]' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- generation -%}"
    "{%- if message.tool_calls -%}"
    "{{- ((' ' + message.content | trim) if message.content else '') + '[TOOL_CALLS] [' -}}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- (', ' if not loop.first else '') + ({'name': fn.name, 'arguments': fn.arguments} | tojson) -}}"
    "{%- endfor -%}{{- ']' -}}"
    "{%- else -%}{{- ' ' + message.content | trim -}}{%- endif -%}"
    "{{- '</s>' -}}{%- endgeneration -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '[TOOL_RESULTS] ' + ({'content': message.content} | tojson) + '[/TOOL_RESULTS]' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

YI = (
    "{%- if tools -%}{{- raise_exception('Yi has no documented tool-call format; drop the tools.') -}}{%- endif -%}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n<|im_start|>assistant\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- if message.tool_calls -%}{{- raise_exception('Yi has no documented tool-call format.') -}}{%- endif -%}"
    "{%- generation -%}{{- message.content + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- elif message.role == 'tool' -%}{{- raise_exception('Yi has no documented tool-result turn.') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

_GLM4_TOOLS = (
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，"
    "你的任务是针对用户的问题和要求提供适当的答复和支持。\\n\\n# 可用工具"
)

GLM4 = (
    "{%- set roles = {'system': '<|system|>', 'user': '<|user|>', 'tool': '<|observation|>'} -%}"
    "{{- '[gMASK]<sop>' -}}"
    "{%- if tools -%}{{- '<|system|>\\n" + _GLM4_TOOLS + "' -}}"
    "{%- for tool in tools -%}{%- set fn = tool.function if tool.function is defined else tool -%}"
    "{{- '\\n\\n## ' + fn.name + '\\n\\n' + (fn | tojson(indent=4)) + "
    "'\\n在调用上述函数时，请使用 Json 格式表示调用的参数。' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set prev = messages[loop.index0 - 1].role if not loop.first else '' -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|assistant|>' -}}"
    "{%- generation -%}"
    "{%- if message.content or not message.tool_calls -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- ('<|assistant|>' if (message.content or not loop.first) else '') + fn.name + '\\n' -}}"
    "{{- fn.arguments if fn.arguments is string else fn.arguments | tojson -}}"
    "{%- endfor -%}"
    "{%- if loop.last -%}{{- '<|endoftext|>' -}}"
    "{%- else -%}{{- roles[messages[loop.index0 + 1].role] -}}{%- endif -%}"
    "{%- endgeneration -%}"
    "{%- else -%}"
    "{{- ('' if prev == 'assistant' else roles[message.role]) + '\\n' + message.content -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)

INTERNLM2 = (
    "{{- '<s>' -}}"
    "{%- if messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system name=<|plugin|>\\n[' -}}"
    "{%- for tool in tools -%}"
    "{{- (', ' if not loop.first else '') + ((tool.function if tool.function is defined else tool) | tojson) -}}"
    "{%- endfor -%}{{- ']<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message.content -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '<|action_start|><|plugin|>\\n' + ({'name': fn.name, 'parameters': fn.arguments} | tojson) -}}"
    "{{- '<|action_end|>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>environment name=<|plugin|>\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class MistralTemplate(Template):
    """Mistral instruct, v3 tokenizer (module docstring)."""

    turn_end_token = "</s>"
    fallback_chat_template = MISTRAL


class YiTemplate(Template):
    """Yi-1.5 chat (module docstring)."""

    turn_end_token = "<|im_end|>"
    fallback_chat_template = YI


class GLM4Template(Template):
    """GLM-4 chat (module docstring). Its hub tokenizer is remote code: pass ``trust_remote_code=True``."""

    fallback_chat_template = GLM4


class InternLM2Template(Template):
    """InternLM2 / InternLM2.5 chat (module docstring). Its hub tokenizer is remote code: ``trust_remote_code=True``."""

    turn_end_token = "<|im_end|>"
    fallback_chat_template = INTERNLM2
