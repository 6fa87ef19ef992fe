"""How TransformersModel finishes, clips and applies gradients; the accumulation gating is core's."""

from __future__ import annotations

import torch

from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.model.stepping import SteppingMixin as CoreSteppingMixin


class SteppingMixin(CoreSteppingMixin):
    """torch optimizers, fp16 GradScaler, DTensor gradients under FSDP2."""

    def _optimizer_params(self, group: OptimizerGroup) -> list[torch.Tensor]:
        self._require_optimizer(group)
        return [p for g in group.optimizer.param_groups for p in g["params"]]

    def _prepare_grads(self, group: OptimizerGroup) -> None:
        """Once per boundary: unscale (fp16) and turn summed gradients into the token-weighted mean."""
        if group.grads_ready:
            return
        self._require_optimizer(group)
        if group.scaler is not None:
            group.scaler.unscale_(group.optimizer)
        factor = group.grad_rescale()
        if factor is not None:
            grads = [p.grad for p in self._optimizer_params(group) if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, factor)
        group.grads_ready = True

    def _clip_grads(self, group: OptimizerGroup, max_grad_norm: float, norm_type: float) -> float:
        params = [p for p in self._optimizer_params(group) if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, norm_type=norm_type)
        # FSDP2: gradients are DTensor shards and the norm a DTensor over all of them (the same on every rank)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _apply_step(self, group: OptimizerGroup) -> None:
        if group.scaler is not None:
            group.scaler.step(group.optimizer)
            group.scaler.update()
        else:
            group.optimizer.step()

    def _zero_optimizer(self, group: OptimizerGroup) -> None:
        group.optimizer.zero_grad(set_to_none=True)
