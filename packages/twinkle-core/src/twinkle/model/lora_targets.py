"""peft's default LoRA targets, for configs that name none (``LoraConfig(r=16, lora_alpha=32)``).

peft itself fills ``target_modules=None`` from its table of defaults per transformers model type
(q_proj and v_proj for Qwen, Llama, Mistral...). Backends that take a LoraConfig outside
``get_peft_model`` (multi-LoRA slots, megatron layers) use the same table, so a config means the
same thing everywhere. peft is imported here only when called (backends that use LoRA have it).
"""

from __future__ import annotations

import copy
from typing import Any


def default_target_modules(model_type: str) -> list[str]:
    """peft's default ``target_modules`` for a transformers ``model_type``."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if model_type not in DEFAULTS:
        raise ValueError(f"LoraConfig has no target_modules and peft has no default for model type "
                         f"{model_type!r}; pass target_modules=[...] (layer names) or 'all-linear'.")
    return list(DEFAULTS[model_type])


def with_default_targets(config: Any, model_type: str) -> Any:
    """``config`` itself when it names targets, else a copy with peft's defaults for ``model_type``."""
    if getattr(config, "target_modules", None) is not None:
        return config
    completed = copy.copy(config)
    completed.target_modules = set(default_target_modules(model_type))
    return completed
