"""clip_grad_norm / step / zero_grad / lr_step, each gated by the group's gradient accumulation."""

from __future__ import annotations

from typing import Any

import torch

from twinkle.model.optimizer_group import OptimizerGroup


class SteppingMixin:
    """The updating half of the TwinkleModel API; between accumulation boundaries every call is a no-op."""

    def clip_grad_norm(self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None,
                       **kwargs: Any) -> float | None:
        """Clip the group's gradients on a boundary; returns the total norm before clipping (else None)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("clip_grad_norm", kwargs)
        if not group.is_boundary:
            return None
        self._prepare_grads(group)
        params = [p for p in self._optimizer_params(group) if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, norm_type=norm_type)
        # FSDP2: gradients are DTensor shards and the norm a DTensor over all of them (the same on every rank)
        group.grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        return group.grad_norm

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on a boundary (through the GradScaler under fp16)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("step", kwargs)
        if not group.is_boundary:
            return
        self._prepare_grads(group)
        if group.scaler is not None:
            group.scaler.step(group.optimizer)
            group.scaler.update()
        else:
            group.optimizer.step()
        group.finish_step()

    def zero_grad(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Clear the group's gradients right after a step (or on a boundary, dropping them)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("zero_grad", kwargs)
        if not group.zero_grad_due:
            return
        if group.optimizer is not None:
            group.optimizer.zero_grad(set_to_none=True)
        else:
            for param in self._group_parameters(group):
                param.grad = None
        group.finish_zero_grad()

    def lr_step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Advance the group's lr scheduler once per optimizer step."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("lr_step", kwargs)
        if not group.lr_step_pending:
            return
        if group.lr_scheduler is not None:
            group.lr_scheduler.step()
        group.lr_step_pending = False

    def clip_grad_and_step(self, max_grad_norm: float | None = 1.0, norm_type: float = 2, *,
                           adapter_name: str | None = None, **kwargs: Any) -> None:
        """clip_grad_norm + step + zero_grad + lr_step on a boundary; ``max_grad_norm=None`` skips clipping."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("clip_grad_and_step", kwargs)
        if not group.is_boundary:
            return
        if max_grad_norm is not None and max_grad_norm > 0:
            self.clip_grad_norm(max_grad_norm, norm_type, adapter_name=group.name)
        self.step(adapter_name=group.name)
        self.zero_grad(adapter_name=group.name)
        self.lr_step(adapter_name=group.name)

    # -------------------------------------------------------------- internals
    def _optimizer_params(self, group: OptimizerGroup) -> list[torch.Tensor]:
        self._require_optimizer(group)
        return [p for g in group.optimizer.param_groups for p in g["params"]]

    def _require_optimizer(self, group: OptimizerGroup) -> None:
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer('AdamW', lr=..., "
                               f"adapter_name={group.name!r}) before stepping.")

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


def _no_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}; it takes adapter_name= and "
                        "gradient_accumulation_steps=.")
