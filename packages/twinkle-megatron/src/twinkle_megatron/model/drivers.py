"""What a group's ``optimizer`` is: megatron-core's distributed optimizer (GPU) or the CPU stand-in.

Both drivers share one gradient contract: backward runs on the *sum* of per-token losses
(megatron's ``calculate_per_token_loss``), and on the accumulation boundary :meth:`finalize`
divides by the number of tokens of the whole window (all data-parallel ranks together, through
``finalize_model_grads`` on GPU), giving the token-weighted mean gradient DESIGN.md asks for.
Clipping happens inside megatron's ``optimizer.step()``; ``clip`` computes and reports the norm
and sets the threshold that step applies.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.optim import MegatronDistributedOptimizer


class TorchDriver:
    """CPU stand-in: torch AdamW with megatron's parameter groups (megatron's optimizer needs CUDA)."""

    kind = "torch AdamW stand-in (CPU only)"

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
        self.optimizer = optimizer
        self.params = params

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def finalize(self, num_tokens: Any) -> None:
        tokens = float(num_tokens)
        grads = [p.grad for p in self.params if p.grad is not None]
        if tokens > 0 and grads:
            torch._foreach_mul_(grads, 1.0 / tokens)

    def clip(self, max_norm: float, norm_type: float) -> float:
        grads = [p for p in self.params if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm, norm_type=norm_type))

    def step(self) -> bool:
        self.optimizer.step()
        return True

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


class MegatronDriver:
    """megatron-core's DistributedOptimizer over Megatron-DDP chunks (GPU)."""

    kind = "megatron-core DistributedOptimizer"

    def __init__(self, optimizer: Any, chunks: list[Any]) -> None:
        self.optimizer = optimizer
        self.chunks = chunks
        self._clip: float | None = None

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _configs(self) -> list[Any]:
        subs = getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]
        return [sub.config for sub in subs]

    def finalize(self, num_tokens: Any) -> None:
        from megatron.core.distributed import finalize_model_grads

        tokens = torch.as_tensor(num_tokens, device=torch.cuda.current_device()).reshape(()).to(torch.int64)
        finalize_model_grads(self.chunks, num_tokens=tokens)

    def clip(self, max_norm: float, norm_type: float) -> float | None:
        if norm_type != 2:
            raise MegatronConfigError(f"norm_type={norm_type}: megatron-core's optimizer clips by the L2 norm only.")
        self._clip = float(max_norm)
        if self.optimizer.prepare_grads():  # found inf/nan (fp16): the step will be skipped
            return None
        return float(self.optimizer.get_grad_norm())

    def step(self) -> bool:
        for config in self._configs():
            config.clip_grad = self._clip or 0.0
        try:
            success, _, _ = self.optimizer.step()
        finally:
            self._clip = None
        return bool(success)

    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def loss_scale(self) -> Any:
        return self.optimizer.get_loss_scale()


def ddp_settings(model: Any) -> dict[str, Any]:
    """Megatron DDP's settings: twinkle's defaults under the DistributedDataParallelConfig kwargs of the model."""
    return {"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, "use_distributed_optimizer": True,
            **model.megatron_kwargs.ddp}


def wrap_for_training(model: Any) -> list[Any]:
    """Megatron DDP (over Float16Module for bf16/fp16) around the GPTModel; once per model."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    config = model.transformer_config
    module = Float16Module(config, model.gpt) if (config.bf16 or config.fp16) else model.gpt
    ddp_config = DistributedDataParallelConfig(**ddp_settings(model))
    chunk = DistributedDataParallel(config, ddp_config, module)
    model.model = chunk
    model.chunks = [chunk]
    return model.chunks


def make_driver(model: Any, group: OptimizerGroup, settings: MegatronDistributedOptimizer) -> Any:
    """Build the group's optimizer; on GPU this wraps the model in Megatron DDP the first time."""
    named = model._group_named_parameters(group)
    if not named:
        raise MegatronConfigError(f"Group {group.name!r} has no trainable parameters; nothing to optimize.")
    if model.device_type != "cuda":
        if model.sizes.world_size > 1:
            raise MegatronConfigError(
                f"On CPU MegatronModel trains on one process only (this mesh has {model.sizes.world_size}): "
                "megatron-core's distributed optimizer and pipeline schedules need CUDA. Run multi-process "
                "training on GPUs; on CPU, tp_size>1 serves forward/evaluation and weight conversion."
            )
        return TorchDriver(settings.cpu_standin(named), [p for _, p in named])
    from megatron.core.optimizer import get_megatron_optimizer

    others = [g.name for g in model.optimizer_group.values() if g.optimizer is not None and g is not group]
    if others:
        raise MegatronConfigError(f"Group {others[0]!r} already owns the Megatron-DDP buffers; on GPU one group per "
                                  "MegatronModel trains.")
    chunks = model.chunks or wrap_for_training(model)
    optimizer = get_megatron_optimizer(settings.config(model.mixed_precision), chunks)
    model.transformer_config.grad_scale_func = optimizer.scale_loss
    return MegatronDriver(optimizer, chunks)
