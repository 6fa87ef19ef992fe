"""MegatronModel and MultiLoraMegatronModel (registered as ``twinkle_megatron.model:<Name>``)."""

from twinkle_megatron.model.megatron_model import MegatronModel
from twinkle_megatron.model.multi_lora import MultiLoraMegatronModel

__all__ = ["MegatronModel", "MultiLoraMegatronModel"]
