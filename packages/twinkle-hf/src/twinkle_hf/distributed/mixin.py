"""DistributedMixin: wraps the model on first use (after every adapter exists) and keeps the
per-step collectives (gradient sync between accumulation boundaries, global token counts).

Wrapping is deferred because peft must inject LoRA layers before DDP/FSDP2 see the parameters:
the user's script adds adapters after building the model. The first ``set_optimizer`` or
forward wraps; adding an adapter afterwards is refused with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle import collective
from twinkle.log import get_logger
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.distributed.plan import DistributedPlan

logger = get_logger("twinkle_hf")


class DistributedMixin:
    """Strategy application and the collectives a training step needs (no-ops on one process)."""

    dist_plan: DistributedPlan
    _wrapped: bool = False
    _ddp: Any = None
    _accelerator: Any = None
    _layer_classes: list[str] | None = None
    _memory_efficient_pending: bool = False
    _weights_dir: str | None = None

    # ------------------------------------------------------------------ wrapping
    def _ensure_wrapped(self) -> None:
        if self._wrapped or not self.dist_plan.distributed:
            self._wrapped = True
            return
        from twinkle_hf.distributed import wrap

        plan = self.dist_plan
        full_state = kept = None
        if self._memory_efficient_pending:
            from twinkle_hf.distributed import meminit

            full_state = meminit.before_wrap(self)
        if self._weights_dir is not None:  # built on meta: adapters and buffers are the only real values yet
            from twinkle_hf.distributed import shard_load

            kept = shard_load.real_tensors(self.model)
        if plan.kind == "ddp":
            adapters = len(getattr(self.model, "peft_config", {}) or {}) if self.is_peft else 0
            self._ddp = wrap.wrap_ddp(self.model, self._run_task_unwrapped, self.device, self.ddp_config,
                                      multi_adapter=adapters > 1)
        elif plan.kind == "fsdp2":
            self._layer_classes = wrap.wrap_fsdp2(self.model, self._hf_model(), plan, self.device_mesh, self.device,
                                                  self.mixed_precision, self.fsdp_config)
        else:
            self._accelerator, self._layer_classes = wrap.wrap_accelerate_fsdp2(
                self.model, self._hf_model(), self.device, self.mixed_precision, self.fsdp_config)
        self._wrapped = True
        if kept is not None:  # storage for this rank's shards only, then its slices from the files
            shard_load.materialize(self.model, self.device, kept)
            shard_load.fill_from_checkpoint(self.model, self._weights_dir, skip=set(kept))
            self._weights_dir = None
        if self._memory_efficient_pending:
            meminit.after_wrap(self, full_state)
            self._memory_efficient_pending = False
        logger.info("wrapped for %s (world %d, layers %s)", plan.kind, plan.world_size, self._layer_classes)

    def set_optimizer(self, optimizer_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Wrap first (FSDP2 replaces parameters with DTensors), then build the optimizer over them."""
        self._group(adapter_name)
        self._ensure_wrapped()
        super().set_optimizer(optimizer_cls, adapter_name=adapter_name, **kwargs)

    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        if self._wrapped and self.dist_plan.distributed:
            raise RuntimeError(
                f"add_adapter_to_model({adapter_name!r}) after the model was wrapped for {self.dist_plan.kind}: add "
                "every adapter before the first set_optimizer/forward (peft must change the model before "
                "DDP/FSDP2 take its parameters).")
        super().add_adapter_to_model(adapter_name, config_or_dir, **kwargs)

    def calculate_metric(self, is_training: bool, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's numbers, equal on every rank (a collective under torchrun: call it on all ranks)."""
        result = super().calculate_metric(is_training, adapter_name=adapter_name, **kwargs)
        if self.dist_plan.distributed:
            rate = result.get("tokens_per_second")
            present, total = collective.sum_floats([rate is not None, rate or 0.0], collective.data_group())
            if present:
                result["tokens_per_second"] = total  # every data rank's tokens over the same wall time
        return result

    # ------------------------------------------------------------------ per step
    def _run_forward(self, task: str, batch: dict[str, Any], pooling: str | None) -> Any:
        if self._ddp is not None:
            return self._ddp(task, batch, pooling)
        return self._run_task_unwrapped(task, batch, pooling)

    def _run_task_unwrapped(self, task: str, batch: dict[str, Any], pooling: str | None) -> Any:
        from twinkle_hf.model.tasks import run_task

        return run_task(self.model, self._hf_model(), task, batch, pooling, through_root=self.dist_plan.sharded)

    def _set_grad_sync(self, group: OptimizerGroup) -> None:
        """Which gradient communication the next backward does (see docs/distributed.md, accumulation).

        DDP all-reduces only on the backward that closes the accumulation window. FSDP2 reduce-scatters
        every micro-batch by default, so gradients stay sharded (1/N of the model per rank); HSDP then
        defers only the all-reduce across replicas to the boundary. ``fsdp_config={'sync_each_microbatch':
        False}`` keeps unsharded gradients between boundaries instead (no communication, full-size memory).
        """
        if not self.dist_plan.distributed:
            return
        sync = group.micro_step + 1 >= group.gradient_accumulation_steps
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = sync
        elif not self.fsdp_config.get("sync_each_microbatch", True):
            self.model.set_requires_gradient_sync(sync)
        elif self.dist_plan.hsdp:
            self.model.set_requires_all_reduce(sync)

    def _global_loss_items(self, total: torch.Tensor, items: Any) -> tuple[torch.Tensor, Any]:
        """(loss sum, items) over every data rank, as tensors on the loss's device; local values on one process.

        One all-reduce and no host sync: the hot path never waits for the device. The count comes
        back in the loss's float type, so dividing by it is the same arithmetic as on one process.
        """
        if not self.dist_plan.distributed:
            return total.detach(), items
        value, count = collective.sum_values([total, items], collective.data_group()).unbind()
        return value, count.to(torch.promote_types(total.dtype, torch.float32))

    @property
    def _grad_average_factor(self) -> int:
        """DDP and FSDP2 average gradients over the data ranks; the loss is scaled back by that many."""
        return self.dist_plan.world_size if self.dist_plan.distributed else 1
