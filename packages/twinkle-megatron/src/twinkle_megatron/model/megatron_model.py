"""MegatronModel: a megatron-core GPTModel converted from an HF checkpoint, plus its training parts.

The public API is core's :class:`~twinkle.model.facade.ModelFacade`; this class only composes the
parts: a :class:`~twinkle_megatron.model.backend.MegatronBackend` (built by ``build.py``: the checks,
megatron's parallel state, this rank's GPTModel and its weights) with LoRA adapters as its adapters
part (``adapters.py``), its checkpoint state (``checkpoint.py``) and the groups.
"""

from __future__ import annotations

from typing import Any

from twinkle.checkpoint.manager import CheckpointManager
from twinkle.mesh import DeviceMesh
from twinkle.model.facade import ModelFacade
from twinkle.model.optimizer_group import DEFAULT_GROUP
from twinkle.remote import remote_class
from twinkle_megatron.model.backend import MegatronBackend
from twinkle_megatron.model.build import build_backend
from twinkle_megatron.model.checkpoint import MegatronCheckpointState


def attach_backend(model: ModelFacade, backend: MegatronBackend) -> None:
    """What both megatron models hold: the backend, its checkpoint state, and the backend's model attributes."""
    model.model_id = backend.model_id
    model.model_path = backend.model_path  # the local directory the weights came from (None: built from config)
    model.mixed_precision = backend.mixed_precision
    model.device_mesh = backend.device_mesh
    model.hf_config = backend.hf_config
    model.gpt = backend.gpt  # this rank's GPTModel
    model.transformer_config = backend.transformer_config
    model._attach(backend, CheckpointManager(MegatronCheckpointState(backend), type(model).__name__), {})


@remote_class()
class MegatronModel(ModelFacade):
    """megatron-core GPTModel with per-adapter optimizer groups (see ``twinkle.model.base``).

    ``model_id``: hub id (``ms://``, ``hf://``), local HF directory, or a full-model checkpoint
    written by :meth:`save`; ``config``: an HF config (random init when ``model_id`` is None, or
    overriding the directory's config). tp/pp/cp/ep/dp and sequence_parallel come from
    ``device_mesh``; VPP is refused. ``kwargs`` are megatron training arguments, each sent to the
    megatron object it configures (TransformerConfig, DDP config, optimizer defaults, micro_batch_size:
    see ``model/kwargs.py``). ``.gpt`` is this rank's GPTModel; ``.model`` what forward runs
    (wrapped in Float16Module for bf16/fp16 on GPU once an optimizer is set). The optimizer is
    megatron-core's (``'default'`` / ``'MegatronDistributedOptimizer'``, settings as kwargs), the lr
    scheduler its ``OptimizerParamScheduler`` (``'default'``); others are refused.
    """

    def __init__(self,  # noqa: D417
                 model_id: str | None = None,
                 config: Any = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 seed: int | None = None,
                 **kwargs: Any) -> None:
        backend = build_backend(model_id, config, device_mesh, mixed_precision, seed, kwargs)
        attach_backend(self, backend)
        self.optimizer_group[DEFAULT_GROUP] = self._new_group(DEFAULT_GROUP)

    def __repr__(self) -> str:
        backend = self.backend
        return (f"MegatronModel({backend.args.family.architecture}, {backend.device_mesh.describe()}, "
                f"groups={list(self.optimizer_group)}, mixed_precision={self.mixed_precision!r}, "
                f"device={backend.device})")
