"""MultiLoraTransformersModel: tenants' LoRA adapters in pre-created slots of one transformers model."""

from twinkle_hf.multi_lora.model import MultiLoraTransformersModel

__all__ = ["MultiLoraTransformersModel"]
