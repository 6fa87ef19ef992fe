"""The high-level Trainer: one :class:`TrainerConfig`, ``Trainer.fit()``, ``twinkle train``.

Importing this package loads no torch or transformers; :meth:`Trainer.fit` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twinkle.config import ConfigError
from twinkle.launch import InfraConfig, ModelConfig
from twinkle.trainer.config import (
    DataloaderConfig,
    DatasetConfig,
    LoraConfig,
    LossConfig,
    LRConfig,
    OptimizerConfig,
    TrainerConfig,
)

if TYPE_CHECKING:
    from twinkle.trainer.trainer import FitResult, Trainer

__all__ = [
    "ConfigError",
    "DataloaderConfig",
    "DatasetConfig",
    "FitResult",
    "InfraConfig",
    "LRConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "Trainer",
    "TrainerConfig",
]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "FitResult"):
        from twinkle.trainer import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'twinkle.trainer' has no attribute {name!r}")
