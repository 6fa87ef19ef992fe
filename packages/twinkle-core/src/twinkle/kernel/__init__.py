"""Kernels: per-op chains of KernelChoice, applied to a model by ``kernelize``.

``from twinkle.kernel import kernelize, KernelChoice, DEFAULT_KERNEL_CONFIG``. Plugins contribute
choices through the ``register_kernels`` hook (kind ``kernel``); ``DEFAULT_KERNEL_CONFIG`` orders
them per op (npu first, then liger on cuda, then the torch reference). Importing this package
imports neither torch nor any kernel library; see docs/kernels.md.
"""

from __future__ import annotations

from typing import Any

from twinkle.kernel.choice import ANY_DEVICE, KernelChoice, KernelNotApplicable
from twinkle.kernel.config import (
    DEFAULT_KERNEL_CONFIG,
    available_choices,
    build_default_config,
    chain_for,
    kernel_function,
    normalize_config,
    select_choice,
)
from twinkle.kernel.kernelize import (
    BASELINE_ENV,
    KernelReport,
    OpResult,
    kernel_report,
    kernelize,
    kernelized,
    torch_baseline,
    unkernelize,
)
from twinkle.kernel.ops import ALIASES, OPS, OpSpec

_LAZY = {
    "fused_linear_cross_entropy": "twinkle.kernel.fused_linear_ce",
    "cross_entropy": "twinkle.kernel.cross_entropy",
    "FusedCEOutput": "twinkle.kernel.cross_entropy",
    "TensorMemoryTracker": "twinkle.kernel.memory",
}

__all__ = [
    "ALIASES",
    "ANY_DEVICE",
    "BASELINE_ENV",
    "DEFAULT_KERNEL_CONFIG",
    "OPS",
    "FusedCEOutput",
    "KernelChoice",
    "KernelNotApplicable",
    "KernelReport",
    "OpResult",
    "OpSpec",
    "TensorMemoryTracker",
    "available_choices",
    "build_default_config",
    "chain_for",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "kernel_function",
    "kernel_report",
    "kernelize",
    "kernelized",
    "normalize_config",
    "select_choice",
    "torch_baseline",
    "unkernelize",
]


def __getattr__(name: str) -> Any:
    """torch-backed names are imported on first use, so ``import twinkle.kernel`` stays cheap."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'twinkle.kernel' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
