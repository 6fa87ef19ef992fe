"""Llama 3 template: the tokenizer's own template, the Llama 3 header format when it has none."""

from __future__ import annotations

from twinkle.template import chat_templates
from twinkle.template.base import Template


class Llama3Template(Template):
    """Llama 3.x instruct (``<|start_header_id|>role<|end_header_id|>`` ... ``<|eot_id|>``)."""

    turn_end_token = "<|eot_id|>"
    fallback_chat_template = chat_templates.LLAMA3
