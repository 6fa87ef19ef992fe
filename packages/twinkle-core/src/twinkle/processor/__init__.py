"""Input processors: encoded rows -> model-ready tensors (padding or packing, device placement)."""

from __future__ import annotations

from twinkle.processor.input_processor import InputProcessor

__all__ = ["InputProcessor"]
