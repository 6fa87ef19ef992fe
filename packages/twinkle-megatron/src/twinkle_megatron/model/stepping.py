"""clip_grad_norm / step / zero_grad / lr_step, each gated by the group's gradient accumulation.

On the boundary the gradients are first *finalized* once: synchronised across data-parallel ranks
and divided by the window's token count (``drivers.py``). Clipping is applied inside the
optimizer's step; ``clip_grad_norm`` returns the norm before clipping.
"""

from __future__ import annotations

from typing import Any

from twinkle.model.optimizer_group import OptimizerGroup


class SteppingMixin:
    """The updating half of the TwinkleModel API; between accumulation boundaries every call is a no-op."""

    def clip_grad_norm(self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None,
                       **kwargs: Any) -> float | None:
        """Set the clipping threshold for this step and return the total norm before clipping (on a boundary)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("clip_grad_norm", kwargs)
        if not group.is_boundary:
            return None
        self._finalize(group)
        norm = group.optimizer.clip(max_grad_norm, norm_type)
        group.grad_norm = norm
        return norm

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on a boundary (megatron skips the update when fp16 gradients overflowed)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("step", kwargs)
        if not group.is_boundary:
            return
        self._finalize(group)
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
            group.optimizer.zero_grad()
        else:
            for param in self._group_parameters(group):
                param.grad = None
        group.finish_zero_grad()

    def lr_step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Advance the group's OptimizerParamScheduler once per optimizer step."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("lr_step", kwargs)
        if not group.lr_step_pending:
            return
        if group.lr_scheduler is not None:
            group.lr_scheduler.step(1)
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

    def _finalize(self, group: OptimizerGroup) -> None:
        """Once per boundary: synchronise and divide the summed gradients by the window's tokens."""
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer('default', lr=..., "
                               f"adapter_name={group.name!r}) before stepping.")
        if group.grads_ready:
            return
        group.optimizer.finalize(group.window_items)
        group.grads_ready = True


def _no_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}; it takes adapter_name= and "
                        "gradient_accumulation_steps=.")
