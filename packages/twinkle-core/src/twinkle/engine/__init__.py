"""The core training engine: the step written once, over a narrow backend interface.

:class:`Engine` runs forward -> loss -> backward for one or many :class:`Route` s and the optimizer
step gated by gradient accumulation; a model backend implements :class:`Backend`. The public model
classes (``TransformersModel``, ``MegatronModel``, their multi-LoRA variants) are facades over an
Engine (``twinkle.model.facade``).
"""

from twinkle.engine.backend import Backend, ModelBackend
from twinkle.engine.engine import Engine, LazyFloat, Route

__all__ = ["Backend", "Engine", "LazyFloat", "ModelBackend", "Route"]
