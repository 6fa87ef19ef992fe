"""MegatronModel and MultiLoraMegatronModel (registered as ``twinkle_megatron.model:<Name>``)."""

from twinkle_megatron.model.megatron_model import MegatronModel, MultiLoraMegatronModel

__all__ = ["MegatronModel", "MultiLoraMegatronModel"]
