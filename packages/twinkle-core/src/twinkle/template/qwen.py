"""Qwen family templates: the tokenizer's own template, ChatML when it has none."""

from __future__ import annotations

from typing import Any, ClassVar

from twinkle.template import chat_templates
from twinkle.template.base import Template
from twinkle.template.spans import Conversation


class Qwen2_5Template(Template):
    """Qwen2.5 (the tokenizer's template adds Qwen's default system prompt itself)."""

    turn_end_token = "<|im_end|>"
    fallback_chat_template = chat_templates.CHATML


class Qwen3Template(Template):
    """Qwen3 thinking switch, decided per conversation unless ``enable_thinking=`` is passed.

    A conversation whose assistant turns carry reasoning (``reasoning_content``, or ``<think>`` in
    the content) renders with ``enable_thinking=True``: the ``<think>...</think>`` block is trained
    with the reply. Any other renders with ``enable_thinking=False``: the empty ``<think></think>``
    block Qwen3 puts before the last reply belongs to the prompt, as at inference, and is not trained.
    """

    turn_end_token = "<|im_end|>"
    fallback_chat_template = chat_templates.CHATML
    default_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}

    def conversation_kwargs(self, conv: Conversation) -> dict[str, Any]:
        if "enable_thinking" in self.explicit_template_kwargs:
            return self.template_kwargs
        thinking = any(m.get("reasoning_content") or "</think>" in m["content"]
                       for m in conv.messages if m["role"] == "assistant")
        return {**self.template_kwargs, "enable_thinking": thinking}


class Qwen3_5Template(Qwen3Template):
    """Qwen3.5: same conversation format and thinking switch as Qwen3."""
