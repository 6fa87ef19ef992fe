"""Llama 3 template: the tokenizer's own template, the Llama 3.1-3.3 instruct format when it has none."""

from __future__ import annotations

from twinkle.template import chat_templates
from twinkle.template.base import Template


class Llama3Template(Template):
    """Llama 3.x instruct (``<|start_header_id|>role<|end_header_id|>`` ... ``<|eot_id|>``).

    The fallback (:data:`twinkle.template.chat_templates.LLAMA3`) is Llama 3.1-3.3's: a system turn with the
    knowledge and today dates (``date_string=``, default '26 Jul 2024'), custom tools listed in the first user
    turn, a call as ``{"name", "parameters"}`` JSON (one per turn), tool results as ``ipython`` turns.
    """

    turn_end_token = "<|eot_id|>"
    fallback_chat_template = chat_templates.LLAMA3
