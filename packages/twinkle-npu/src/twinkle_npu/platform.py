"""The Ascend NPU platform: device ``npu``, collectives over ``hccl``, torch_npu imported lazily."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from twinkle.platform import Platform


def _torch_npu() -> ModuleType | None:
    """torch_npu if it is installed and imports (it registers ``torch.npu``), else None."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # a broken CANN install must read as "no NPU", not crash detection
        return None


class NPUPlatform(Platform):
    name = "npu"
    device_type = "npu"
    dist_backend = "cpu:gloo,npu:hccl"
    priority = 20

    @classmethod
    def is_available(cls) -> bool:
        if _torch_npu() is None:
            return False
        import torch

        return bool(hasattr(torch, "npu") and torch.npu.is_available())

    @classmethod
    def device_count(cls) -> int:
        if not cls.is_available():
            return 0
        import torch

        return torch.npu.device_count()

    @classmethod
    def set_device(cls, local_rank: int) -> None:
        if not cls.is_available():
            raise RuntimeError(
                "NPU platform selected but torch_npu is not installed or sees no device: pip install torch-npu"
            )
        import torch

        torch.npu.set_device(local_rank % max(1, torch.npu.device_count()))

    @classmethod
    def comm_device(cls):
        import torch

        return torch.device("npu", torch.npu.current_device())
