"""How TransformersModel finishes, clips and applies gradients; the accumulation gating is core's."""

from __future__ import annotations

from typing import Any

import torch

from twinkle import collective
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
            self._agree_found_inf(group)
        factor = group.grad_rescale()
        if factor is not None:
            grads = [p.grad for p in self._optimizer_params(group) if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, factor)
        group.grads_ready = True

    def _agree_found_inf(self, group: OptimizerGroup) -> None:
        """fp16: every rank's scaler sees an inf/NaN that any rank's gradient shard holds.

        Under FSDP2 each rank unscales only its own shards; without this one rank could skip a step
        that the others take (and the scales drift apart).
        """
        found = _found_inf(group)
        local = torch.stack([t.reshape(()).to(torch.float32) for t in found.values()]).max() if found \
            else torch.zeros(())
        agreed = self._any_rank(local)  # every rank takes part, even one without gradients
        for flag in found.values():
            flag.copy_(agreed.to(flag.device))

    def _clip_grads(self, group: OptimizerGroup, max_grad_norm: float, norm_type: float) -> float:
        params = [p for p in self._optimizer_params(group) if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, norm_type=norm_type)
        # FSDP2: gradients are DTensor shards and the norm a DTensor over all of them (the same on every rank)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _apply_step(self, group: OptimizerGroup) -> bool:
        if group.scaler is None:
            group.optimizer.step()
            return True
        overflow = any(bool(t.item()) for t in _found_inf(group).values())
        group.scaler.step(group.optimizer)  # skips the update itself on overflow
        group.scaler.update()
        return not overflow

    def _skip_update(self, group: OptimizerGroup) -> None:
        if group.scaler is not None and _found_inf(group):  # back off the loss scale if the gradients overflowed
            group.scaler.update()

    def _any_rank(self, flags: Any) -> Any:
        plan = getattr(self, "dist_plan", None)
        if plan is None or not plan.distributed:
            return flags
        return collective.all_reduce(flags, op="max")

    def _zero_optimizer(self, group: OptimizerGroup) -> None:
        group.optimizer.zero_grad(set_to_none=True)


def _found_inf(group: OptimizerGroup) -> dict[Any, torch.Tensor]:
    """The scaler's inf/NaN flags per device, recorded by ``unscale_`` for the group's optimizer."""
    return group.scaler._found_inf_per_device(group.optimizer)
