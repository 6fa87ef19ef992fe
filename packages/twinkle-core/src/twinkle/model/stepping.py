"""clip_grad_norm / step / zero_grad / lr_step, gated by the group's gradient accumulation.

The gating is the same for every backend (between boundaries each call is a no-op; zero_grad
follows a step; the scheduler advances once per optimizer step), so it lives here. A backend
supplies how to finish the window's gradients and how to clip, step, zero and advance:
``_prepare_grads``, ``_clip_grads``, ``_apply_step``, ``_zero_optimizer``, ``_advance_lr``.

Skipped steps are decided here too, the same way for every backend: before the optimizer runs,
a loss of the window or the gradient norm that is inf/NaN skips the step (every rank that holds
part of the model agrees, through ``_any_rank``); the backend's ``_apply_step`` may refuse as well
(an fp16 overflow, megatron's optimizer reporting no success) by returning False. A skipped step
changes no weight, no optimizer state, no ``cur_step`` and no lr (see ``OptimizerGroup.skip_step``).
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

    def _apply_step(self, group: OptimizerGroup) -> bool:
        """Run the optimizer; False when it skipped the update itself."""
        return group.optimizer.step() is not False

    def _skip_update(self, group: OptimizerGroup) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """The step is skipped before the optimizer ran (e.g. an fp16 scaler still backs off here)."""

    def _any_rank(self, flags: Any) -> Any:
        """``flags`` (a tensor; > 0 means "bad") maximised elementwise over every rank holding part of this model."""
        return flags

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
        group.take_skip_limit(kwargs)
        if kwargs:
            raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}; it takes adapter_name=, "
                            "gradient_accumulation_steps= and max_consecutive_skips=.")
        return group

    def _nonfinite_reason(self, group: OptimizerGroup) -> str | None:
        """Why this window must not be applied (an inf/NaN loss or gradient norm), agreed by all ranks; else None.

        One small all-reduce and one host sync per optimizer step.
        """
        import math

        import torch

        norm = group.window_grad_norm
        norm_bad = norm is not None and not math.isfinite(norm)
        finite = group.window_finite
        loss_bad = (~finite).to(torch.float32).reshape(()) if isinstance(finite, torch.Tensor) else torch.zeros(())
        flags = torch.stack([loss_bad, torch.tensor(float(norm_bad), device=loss_bad.device)])
        agreed = self._any_rank(flags).tolist()
        if not max(agreed):
            return None
        if agreed[0]:
            return "the loss is inf/NaN" + ("" if float(loss_bad) else " on another rank")
        return f"the gradient norm is {norm if norm_bad else 'inf/NaN on another rank'}"

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
        group.grad_norm = group.window_grad_norm = self._clip_grads(group, max_grad_norm, norm_type)
        return group.grad_norm

    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on a boundary, unless the loss or gradients are inf/NaN (the step is then skipped)."""
        group = self._stepping_group("step", adapter_name, kwargs)
        if not group.is_boundary:
            return
        self._prepare_grads(group)
        reason = self._nonfinite_reason(group)
        if reason is None:
            if self._apply_step(group):
                group.finish_step()
                return
            reason = "the optimizer skipped it (inf/NaN gradients: fp16 loss-scale overflow)"
        else:
            self._skip_update(group)
        group.skip_step(reason)

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
