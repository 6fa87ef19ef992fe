"""TransformersModel: a transformers model plus its training parts, on one process or many.

The public API is core's :class:`~twinkle.model.facade.ModelFacade`; this class only composes the
parts: an :class:`~twinkle_hf.model.backend.HFBackend` (built by ``build.py``: the module, its
plan and precision), its checkpoint state (``checkpoint.py``) and the groups.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForCausalLM, PretrainedConfig

from twinkle.checkpoint.manager import CheckpointManager
from twinkle.mesh import DeviceMesh
from twinkle.model.facade import ModelFacade, locked
from twinkle.model.optimizer_group import DEFAULT_GROUP
from twinkle.remote import remote_class
from twinkle_hf.model.build import build_backend
from twinkle_hf.model.checkpoint import HFCheckpointState


@remote_class()
class TransformersModel(ModelFacade):
    """A transformers model with per-adapter optimizer groups (see ``twinkle.model.base``).

    ``model_id`` is a hub id (``ms://``, ``hf://``), a ``twinkle://`` asset, a local directory or a
    full-model checkpoint written by :meth:`save`; ``config`` builds a randomly initialised model.
    ``kwargs`` go to ``from_pretrained`` / ``from_config`` (weights default to float32 so mixed
    precision keeps fp32 master weights). ``mixed_precision``: ``no``, ``bf16`` (autocast, CPU too),
    ``fp16`` (autocast + GradScaler configured by ``grad_scaler_config``) or ``fp8`` (a registered
    precision provider). ``.model`` is the underlying module (a ``PeftModel`` once adapters exist).
    Without adapters the single group is ``'default'`` and trains the whole model.

    Under ``torchrun`` (or Ray) the model is wrapped from ``device_mesh`` and ``strategy``: DDP for a
    data-parallel-only mesh, FSDP2 per decoder layer when ``fsdp_size > 1`` (``native_fsdp``: torch's
    ``fully_shard``, HSDP when ``dp_size > 1`` too — also chosen for ``accelerate`` on such a mesh;
    ``accelerate``: its FSDP2 plugin from ``fsdp_config``). Wrapping is one step, :meth:`parallelize`,
    which ``set_optimizer`` runs after every adapter exists. Under FSDP2 a safetensors checkpoint is
    built on the meta device and every rank reads only its own shards when the model is wrapped
    (build on meta -> adapters -> shard -> load shards -> optimizer). ``memory_efficient_init``: only
    rank 0 reads (or builds) the weights (see docs/distributed.md).
    ``gradient_checkpointing``: recompute activations in backward (the ``GradientCheckpointing`` patch):
    the same losses with less activation memory. ``strict_load``: weights in ``model_id`` that do not fit
    the model (missing/unexpected/mis-shaped) are an error instead of transformers' warning. ``kernelize``:
    swap in the installed fused kernels (``twinkle.kernel.kernelize``: liger's RMSNorm, SwiGLU, RoPE on CUDA);
    None (the default) does so on CUDA without FSDP2 sharding, False never, True also elsewhere (on the CPU
    it picks torch's own ops). ``fused_loss``: a training step without a loss set computes the cross-entropy
    from the hidden states chunk by chunk (``task='fused_lm_ce'``, the logits are never materialised); None
    (the default) does so on CUDA where liger-kernel is installed, False never, True also elsewhere (the torch
    chunked kernel). ``forward`` still returns logits.
    """

    supports_async_save = True

    def __init__(self,  # noqa: D417
                 model_cls: Any = AutoModelForCausalLM,
                 model_id: str | None = None,
                 config: PretrainedConfig | None = None,
                 device_mesh: DeviceMesh | None = None,
                 mixed_precision: str = "bf16",
                 strategy: str = "accelerate",
                 ddp_config: dict[str, Any] | None = None,
                 fsdp_config: dict[str, Any] | None = None,
                 grad_scaler_config: dict[str, Any] | None = None,
                 memory_efficient_init: bool = False,
                 gradient_checkpointing: bool = False,
                 strict_load: bool = False,
                 kernelize: bool | None = None,
                 fused_loss: bool | None = None,
                 **kwargs: Any) -> None:
        backend = build_backend(model_cls, model_id, config, device_mesh, mixed_precision, strategy, ddp_config,
                                fsdp_config, grad_scaler_config, memory_efficient_init, strict_load, kwargs)
        self.model_id = model_id
        self.model_path = backend.model_path  # the local directory the weights came from (None: built from config)
        self.mixed_precision = mixed_precision
        self.strategy = strategy
        self.memory_efficient_init = memory_efficient_init
        self.device_mesh = backend.device_mesh
        self._attach(backend, CheckpointManager(HFCheckpointState(backend), type(self).__name__), {})
        backend.groups = self.optimizer_group
        self.optimizer_group[DEFAULT_GROUP] = self._new_group(DEFAULT_GROUP)
        if gradient_checkpointing:
            self.apply_patch("GradientCheckpointing")
        if kernelize_by_default(kernelize, backend.device.type, backend.dist_plan.sharded):
            from twinkle.kernel import kernelize as apply_kernels

            apply_kernels(self)
        if fused_loss_by_default(fused_loss, backend.device.type, liger_installed()):
            backend.training_task = "fused_lm_ce"  # forward_backward without a loss: no (tokens, vocab) logits

    @property
    def is_peft(self) -> bool:
        """Whether adapters exist (the module is a ``PeftModel``)."""
        return self.backend.module is not self.backend.hf_model()

    @locked
    def merged_model(self, adapter_name: str) -> Any:
        """The base model with adapter ``adapter_name`` merged in, as a plain transformers model on the host.

        Every rank must call it (a sharded model's weights are gathered); training continues unmerged.

        Args:
            adapter_name: the LoRA adapter to merge.

        Returns:
            The merged model on the CPU on rank 0 (any rank of a single process); None on the other ranks.
        """
        from twinkle_hf.model.merge import merged_model

        self._require_parallelized("merged_model")
        return merged_model(self.backend, adapter_name)

    @locked
    def freeze_vision(self, vision_tower: bool = True, projector: bool = False) -> None:
        """Full training of a VL model: stop training the vision tower (and/or the projector); call before
        set_optimizer. ``vision_tower=False, projector=False`` makes both trainable again."""
        from twinkle_hf.model.vision import freeze_vision, require_vision_parts

        require_vision_parts(self.backend.hf_model(), "freeze_vision")
        group = self.optimizer_group.get(DEFAULT_GROUP)
        if self.is_peft or group is None:
            raise RuntimeError("freeze_vision is for full-model training; a LoRA adapter chooses its parts with "
                               "add_adapter_to_model(..., vision_tower=, projector=).")
        if group.optimizer is not None:
            raise RuntimeError("freeze_vision must come before set_optimizer (the optimizer holds the trainable "
                               "parameters).")
        freeze_vision(self.backend.hf_model(), vision_tower, projector)

    def __repr__(self) -> str:
        return (f"TransformersModel({type(self.backend.hf_model()).__name__}, groups={list(self.optimizer_group)}, "
                f"mixed_precision={self.mixed_precision!r}, device={self.device})")


def kernelize_by_default(flag: bool | None, device_type: str, sharded: bool) -> bool:
    """Whether a new model is kernelized: ``flag`` when given, else on CUDA unless FSDP2 shards it (liger's
    kernels under FSDP2 have not run on a GPU here yet)."""
    if flag is not None:
        return flag
    return device_type == "cuda" and not sharded


def liger_installed() -> bool:
    """Whether liger-kernel can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def fused_loss_by_default(flag: bool | None, device_type: str, liger: bool) -> bool:
    """Whether a training step without a loss uses the fused linear cross-entropy: ``flag`` when given, else on
    CUDA with liger's kernel (on the CPU the default loss path, and its recorded numerics, stay as they are)."""
    if flag is not None:
        return flag
    return device_type == "cuda" and liger
