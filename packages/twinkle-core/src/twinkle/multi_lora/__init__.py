"""Multi-tenant LoRA slot bookkeeping, shared by every backend (see ``manager.py``)."""

from twinkle.multi_lora.manager import LoraTenant, MultiLora, SlotBackend
from twinkle.multi_lora.tenant import TenantSpec

__all__ = ["LoraTenant", "MultiLora", "SlotBackend", "TenantSpec"]
