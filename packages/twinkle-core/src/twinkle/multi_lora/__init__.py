"""Multi-tenant LoRA slot bookkeeping, shared by every backend (see ``manager.py``)."""

from twinkle.multi_lora.manager import LoraTenant, MultiLora, SlotBackend
from twinkle.multi_lora.tenant import LOCKED_METHODS, TenantSpec, serialize_calls

__all__ = ["LOCKED_METHODS", "LoraTenant", "MultiLora", "SlotBackend", "TenantSpec", "serialize_calls"]
