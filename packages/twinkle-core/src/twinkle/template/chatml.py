"""ChatMLTemplate: always render ChatML (<|im_start|>role ... <|im_end|>), whatever the tokenizer carries."""

from __future__ import annotations

from twinkle.template import chat_templates
from twinkle.template.base import Template


class ChatMLTemplate(Template):
    """For base models and tokenizers without a chat template that should be trained in ChatML."""

    turn_end_token = "<|im_end|>"
    forced_chat_template = chat_templates.CHATML
