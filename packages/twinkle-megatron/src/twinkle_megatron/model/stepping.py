"""How MegatronModel finishes, clips and applies gradients; the accumulation gating is core's.

On the boundary the gradients are first *finalized* once: synchronised across data-parallel ranks
and divided by the window's token count (``drivers.py``). Clipping is applied inside the
optimizer's step; ``clip_grad_norm`` returns the norm before clipping.
"""

from __future__ import annotations

from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.model.stepping import SteppingMixin as CoreSteppingMixin


class SteppingMixin(CoreSteppingMixin):
    """megatron-core's optimizer (or its CPU stand-in) behind the driver interface."""

    def _prepare_grads(self, group: OptimizerGroup) -> None:
        """Once per boundary: synchronise and divide the summed gradients by the window's tokens."""
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer('default', lr=..., "
                               f"adapter_name={group.name!r}) before stepping.")
        if group.grads_ready:
            return
        group.optimizer.finalize(group.window_items)
        group.grads_ready = True

    def _clip_grads(self, group: OptimizerGroup, max_grad_norm: float, norm_type: float) -> float:
        return group.optimizer.clip(max_grad_norm, norm_type)

    def _advance_lr(self, group: OptimizerGroup) -> None:
        group.lr_scheduler.step(1)
