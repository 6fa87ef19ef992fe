"""TransformersModel: the TwinkleModel backend on HF transformers (+ peft for LoRA)."""

from __future__ import annotations

from twinkle_hf.model.transformers_model import TransformersModel

__all__ = ["TransformersModel"]
