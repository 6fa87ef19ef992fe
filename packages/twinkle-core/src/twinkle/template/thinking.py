"""The thinking switch: whether a conversation renders in its family's thinking mode.

Families with a thinking mode (Qwen3, Qwen3.5, DeepSeek V4) read the chat-template variable
``enable_thinking``. Unless the template was given ``enable_thinking=`` explicitly, it is decided per
conversation: a conversation whose assistant turns carry reasoning (``reasoning_content``, or
``</think>`` inside the content) renders in thinking mode and its reasoning is trained with the reply;
any other renders in the non-thinking mode, where the family's empty or closed think block belongs to
the prompt, as at inference.
"""

from __future__ import annotations

from typing import Any

from twinkle.template.spans import Conversation


def has_reasoning(conv: Conversation) -> bool:
    return any(m.get("reasoning_content") or "</think>" in m["content"]
               for m in conv.messages if m["role"] == "assistant")


def thinking_kwargs(template_kwargs: dict[str, Any], explicit: dict[str, Any], conv: Conversation) -> dict[str, Any]:
    """``template_kwargs`` with ``enable_thinking`` decided for ``conv`` (an explicit value wins)."""
    if "enable_thinking" in explicit:
        return template_kwargs
    return {**template_kwargs, "enable_thinking": has_reasoning(conv)}
