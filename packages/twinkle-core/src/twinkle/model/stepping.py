"""clip_grad_norm / step / zero_grad / lr_step, gated by the group's gradient accumulation.

The gating is the same for every backend (between boundaries each call is a no-op; zero_grad
follows a step; the scheduler advances once per optimizer step), so it lives here. A backend
supplies how to finish the window's gradients and how to clip, step, zero and advance:
``_prepare_grads``, ``_clip_grads``, ``_apply_step``, ``_zero_optimizer``, ``_advance_lr``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from twinkle.model.optimizer_group import OptimizerGroup


class SteppingMixin(ABC):
    """The updating half of the TwinkleModel API."""

    # ----------------------------------------------------------- backend hooks
    @abstractmethod
    def _prepare_grads(self, group: OptimizerGroup) -> None:
        """Once per boundary (idempotent): make the accumulated gradients the window's token-weighted mean."""

    @abstractmethod
    def _clip_grads(self, group: OptimizerGroup, max_grad_norm: float, norm_type: float) -> float:
        """Clip the prepared gradients; return the total norm before clipping."""

    def _apply_step(self, group: OptimizerGroup) -> None:
        group.optimizer.step()

    def _zero_optimizer(self, group: OptimizerGroup) -> None:
        group.optimizer.zero_grad()

    def _advance_lr(self, group: OptimizerGroup) -> None:
        group.lr_scheduler.step()

    def _require_optimizer(self, group: OptimizerGroup) -> None:
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer(..., "
                               f"adapter_name={group.name!r}) before stepping.")

    def _stepping_group(self, method: str, adapter_name: str | None, kwargs: dict[str, Any]) -> OptimizerGroup:
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        if kwargs:
            raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}; it takes adapter_name= and "
                            "gradient_accumulation_steps=.")
        return group

    # -------------------------------------------------------------- public API
    def set_optimizer_params(self, *, adapter_name: str | None = None, **params: Any) -> dict[str, Any]:
        """Change the group's optimizer hyper-parameters in place (``lr=``, ``betas=``, ``eps=``, ``weight_decay=``).

        Unlike ``set_optimizer`` the optimizer keeps its state (moments, step counts): this is how a
        client-driven schedule (the Tinker API sends the Adam parameters with every step) changes them.
        Every param group gets the values; a name no param group has is a TypeError and nothing changes.
        An lr scheduler, if any, sets ``lr`` again at its next step. Returns the values now in effect.
        """
        group = self._group(adapter_name)
        self._require_optimizer(group)
        param_groups = self._optimizer_param_groups(group)
        unknown = sorted(k for k in params if any(k not in g for g in param_groups))
        if unknown:
            known = sorted(k for k in param_groups[0] if k != "params")
            raise TypeError(f"The optimizer of group {group.name!r} ({type(group.optimizer).__name__}) has no "
                            f"hyper-parameters {unknown}; it has {known}.")
        for param_group in param_groups:
            param_group.update(params)
        return {k: param_groups[0][k] for k in params}

    def _optimizer_param_groups(self, group: OptimizerGroup) -> list[dict[str, Any]]:
        """The param groups ``set_optimizer_params`` updates (a backend with a wrapped optimizer overrides this)."""
        return list(group.optimizer.param_groups)

    def clip_grad_norm(self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None,
                       **kwargs: Any) -> float | None:
        """Clip the group's gradients on a boundary; returns the total norm before clipping (else None)."""
        group = self._stepping_group("clip_grad_norm", adapter_name, kwargs)
        if not group.is_boundary:
            return None
        self._prepare_grads(group)
        group.grad_norm = self._clip_grads(group, max_grad_norm, norm_type)
        return group.grad_norm

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on a boundary."""
        group = self._stepping_group("step", adapter_name, kwargs)
        if not group.is_boundary:
            return
        self._prepare_grads(group)
        self._apply_step(group)
        group.finish_step()

    def zero_grad(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Clear the group's gradients right after a step (or on a boundary, dropping them)."""
        group = self._stepping_group("zero_grad", adapter_name, kwargs)
        if not group.zero_grad_due:
            return
        if group.optimizer is not None:
            self._zero_optimizer(group)
        else:
            for param in self._group_parameters(group):
                param.grad = None
        group.finish_zero_grad()

    def lr_step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Advance the group's lr scheduler once per optimizer step."""
        group = self._stepping_group("lr_step", adapter_name, kwargs)
        if not group.lr_step_pending:
            return
        if group.lr_scheduler is not None:
            self._advance_lr(group)
        group.lr_step_pending = False

    def clip_grad_and_step(self, max_grad_norm: float | None = 1.0, norm_type: float = 2, *,
                           adapter_name: str | None = None, **kwargs: Any) -> None:
        """clip_grad_norm + step + zero_grad + lr_step on a boundary; ``max_grad_norm=None`` skips clipping."""
        group = self._stepping_group("clip_grad_and_step", adapter_name, kwargs)
        if not group.is_boundary:
            return
        if max_grad_norm is not None and max_grad_norm > 0:
            self.clip_grad_norm(max_grad_norm, norm_type, adapter_name=group.name)
        self.step(adapter_name=group.name)
        self.zero_grad(adapter_name=group.name)
        self.lr_step(adapter_name=group.name)
