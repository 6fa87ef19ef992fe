"""Templates: render standard conversations with a chat template and label the assistant tokens.

Registered by name (``dataset.set_template('Qwen3_5Template')``) through the plugin registry.
"""

from __future__ import annotations

from twinkle.constants import IGNORE_INDEX, TRUNCATION_STRATEGIES
from twinkle.template.base import Template, load_tokenizer
from twinkle.template.chatml import ChatMLTemplate
from twinkle.template.deepseek import DeepSeekR1Template, DeepSeekV4Template
from twinkle.template.internvl import InternVL2_5Template
from twinkle.template.llama import Llama3Template
from twinkle.template.others import GLM4Template, InternLM2Template, MistralTemplate, YiTemplate
from twinkle.template.qwen import Qwen2_5Template, Qwen3_5Template, Qwen3Template
from twinkle.template.vl import Qwen2_5VLTemplate, Qwen2VLTemplate, Qwen3_5VLTemplate, Qwen3VLTemplate, VLTemplate

__all__ = [
    "IGNORE_INDEX",
    "TRUNCATION_STRATEGIES",
    "ChatMLTemplate",
    "DeepSeekR1Template",
    "DeepSeekV4Template",
    "GLM4Template",
    "InternLM2Template",
    "InternVL2_5Template",
    "Llama3Template",
    "MistralTemplate",
    "Qwen2VLTemplate",
    "Qwen2_5Template",
    "Qwen2_5VLTemplate",
    "Qwen3Template",
    "Qwen3VLTemplate",
    "Qwen3_5Template",
    "Qwen3_5VLTemplate",
    "Template",
    "VLTemplate",
    "YiTemplate",
    "load_tokenizer",
]
