"""set_optimizer / set_lr_scheduler of MegatronModel; the other components come from core.

The optimizer and scheduler are megatron-core's only (``'default'``); anything else is refused
with the accepted names before the group changes. A failing call leaves the group as it was.
"""

from __future__ import annotations

from typing import Any

from twinkle.model.components import ComponentsMixin as CoreComponentsMixin
from twinkle_megatron.model.drivers import make_driver
from twinkle_megatron.optim import OptimizerParamScheduler, check_scheduler, resolve_optimizer


class ComponentsMixin(CoreComponentsMixin):
    """Per-group components of a MegatronModel: megatron-core's optimizer and scheduler."""

    def set_optimizer(self, optimizer_cls: Any = "default", *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use megatron-core's distributed optimizer (``'default'`` / ``'MegatronDistributedOptimizer'``).

        kwargs are its settings (``lr``, ``weight_decay``, ``adam_beta1``...), over the OptimizerConfig
        fields given to the constructor. Other optimizers are refused.
        """
        group = self._group(adapter_name)
        settings = resolve_optimizer(optimizer_cls, {**self.megatron_kwargs.optimizer, **kwargs})
        driver = make_driver(self, group, settings)
        group.optimizer = driver
        group.lr_scheduler = None

    def set_lr_scheduler(self, scheduler_cls: Any = "default", *, adapter_name: str | None = None,
                         **kwargs: Any) -> None:
        """Use megatron-core's OptimizerParamScheduler (``'default'``); it steps once per optimizer step."""
        group = self._group(adapter_name)
        check_scheduler(scheduler_cls)
        if group.optimizer is None:
            raise RuntimeError(f"set_lr_scheduler needs an optimizer: call set_optimizer('default', ...) for group "
                               f"{group.name!r} first.")
        group.lr_scheduler = OptimizerParamScheduler(group.optimizer.optimizer, **kwargs)


    def _group_lr(self, group: Any) -> float | None:
        return group.optimizer.lr if group.optimizer is not None else None

    def _patch_target(self) -> Any:
        """Patches apply to this rank's GPTModel."""
        return self.gpt
