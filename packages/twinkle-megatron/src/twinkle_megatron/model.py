"""MegatronModel and MultiLoraMegatronModel: declared so the registry wiring is real end to end.

The training implementation on megatron-core is not written yet: both classes keep every
TwinkleModel method abstract, so constructing one fails with Python's TypeError listing them.
"""

from __future__ import annotations

from twinkle.model import TwinkleModel
from twinkle.remote import remote_class


@remote_class()
class MegatronModel(TwinkleModel):
    """TwinkleModel on megatron-core (TP/PP/CP/EP/DP from the DeviceMesh)."""


@remote_class()
class MultiLoraMegatronModel(MegatronModel):
    """MegatronModel with pre-allocated LoRA slots for many tenants."""
