"""The high-level Trainer: one :class:`TrainerConfig`, ``Trainer.fit()``, ``twinkle train``.

Every config class also answers to xtuner v1's name (``OptimConfig``, ``CELossConfig``, ``FSDPConfig``...).

Importing this package loads no torch or transformers; :meth:`Trainer.fit` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twinkle.config import ConfigError
from twinkle.launch import InfraConfig, ModelConfig
from twinkle.trainer.config import (
    AdamWConfig,
    CELossConfig,
    DataloaderConfig,
    DatasetCombine,
    DatasetConfig,
    LoraConfig,
    LossConfig,
    LRConfig,
    OptimConfig,
    OptimizerConfig,
    TokenizeFnConfig,
    TrainerConfig,
)
from twinkle.trainer.groups import (
    FSDPConfig,
    HooksConfig,
    InternalMetricsConfig,
    LoadCheckpointConfig,
    ResumeConfig,
)

if TYPE_CHECKING:
    from twinkle.trainer.trainer import FitResult, Trainer

__all__ = [
    "AdamWConfig",
    "CELossConfig",
    "ConfigError",
    "DataloaderConfig",
    "DatasetCombine",
    "DatasetConfig",
    "FSDPConfig",
    "FitResult",
    "HooksConfig",
    "InfraConfig",
    "InternalMetricsConfig",
    "LRConfig",
    "LoadCheckpointConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "OptimizerConfig",
    "ResumeConfig",
    "TokenizeFnConfig",
    "Trainer",
    "TrainerConfig",
]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "FitResult"):
        from twinkle.trainer import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'twinkle.trainer' has no attribute {name!r}")
