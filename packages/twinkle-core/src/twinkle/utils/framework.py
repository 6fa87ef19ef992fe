"""Questions about the framework and devices, answered through the platform registry."""

from __future__ import annotations

from twinkle.registry import get_registry


def _platform_available(name: str) -> bool:
    registry = get_registry()
    if name not in registry.names("platform"):
        return False
    from twinkle.platform import is_available

    return is_available(name, registry.load("platform", name))


class Torch:
    """Device checks a training script makes before choosing a code path."""

    @staticmethod
    def is_gpu_available() -> bool:
        return _platform_available("cuda")

    @staticmethod
    def is_npu_available() -> bool:
        return _platform_available("npu")

    @staticmethod
    def device_type() -> str:
        from twinkle.platform import detect_platform

        return detect_platform().device_type
