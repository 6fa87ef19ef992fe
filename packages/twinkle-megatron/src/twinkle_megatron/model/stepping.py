"""How MegatronModel finishes, clips and applies gradients; the accumulation gating is core's.

On the boundary the gradients are first *finalized* once: synchronised across data-parallel ranks
and divided by the window's token count (``drivers.py``). The driver clips the prepared gradients;
``clip_grad_norm`` returns the norm before clipping. A step the optimizer refuses
(``step()`` reports no success: fp16 inf/NaN gradients) is a skipped step, handled by core.
"""

from __future__ import annotations

from typing import Any

from twinkle import collective
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

    def _apply_step(self, group: OptimizerGroup) -> bool:
        """megatron-core's optimizer reports whether it updated (False: fp16 inf/NaN gradients found)."""
        return bool(group.optimizer.step())

    def _any_rank(self, flags: Any) -> Any:
        """Every rank of the model (all data, tensor and pipeline ranks) decides a skip together."""
        return collective.all_reduce(flags, op="max") if self.sizes.world_size > 1 else flags

    def _advance_lr(self, group: OptimizerGroup) -> None:
        group.lr_scheduler.step(1)
