"""set_optimizer / set_lr_scheduler of TransformersModel; the other components come from core.

A call that fails leaves the group exactly as it was: the new component is built first and stored last.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

from twinkle.log import get_logger
from twinkle.model.components import ComponentsMixin as CoreComponentsMixin
from twinkle.model.components import build_component
from twinkle.model.optimizer_group import check_lr, check_optimizer_lrs, check_optimizer_params
from twinkle.registry import resolve
from twinkle_hf.model.optim import build_optimizer

logger = get_logger("twinkle_hf")


class ComponentsMixin(CoreComponentsMixin):
    """Per-group components of a TransformersModel: torch optimizers and schedulers."""

    def set_optimizer(self, optimizer_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an optimizer over the group's trainable parameters (``'AdamW'``, ``'Muon'``, a class or instance).

        Muon takes the hidden 2-D matrices and an AdamW partner the rest (see ``optim.py``).
        Replacing an optimizer drops the group's lr scheduler, which was bound to the old one.
        """
        group = self._group(adapter_name)
        if "lr" in kwargs:
            check_lr(kwargs["lr"])
        resolved = resolve("optimizer", optimizer_cls)
        if isinstance(resolved, Optimizer):
            if kwargs:
                raise TypeError(f"set_optimizer got an optimizer instance and arguments {sorted(kwargs)}; "
                                "pass the class or its name to construct it with arguments.")
            check_optimizer_lrs(resolved)
            others = {name: self._group_parameters(g) for name, g in self.optimizer_group.items() if g is not group}
            check_optimizer_params(resolved, self._group_parameters(group), group.name, others)
            optimizer = resolved
        elif isinstance(resolved, type) and issubclass(resolved, Optimizer):
            params = self._group_parameters(group)
            keep = set() if group.is_adapter else self._embedding_parameter_ids()
            optimizer = build_optimizer(resolved, params, dict(kwargs), keep_on_adamw=keep)
        else:
            raise TypeError(f"set_optimizer needs a torch.optim.Optimizer class, instance or registered name; got "
                            f"{resolved!r}.")
        if group.lr_scheduler is not None:
            logger.warning("set_optimizer on group %r replaced the optimizer; its lr scheduler was dropped, "
                           "call set_lr_scheduler again.", group.name)
            group.lr_scheduler = None
        group.optimizer = optimizer

    def set_lr_scheduler(self, scheduler_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an lr scheduler on the group's optimizer; it advances once per optimizer step.

        ``num_training_steps`` of the warm-up schedulers therefore counts optimizer steps.
        """
        group = self._group(adapter_name)
        if group.optimizer is None:
            raise RuntimeError(f"set_lr_scheduler needs an optimizer: call set_optimizer(...) for group "
                               f"{group.name!r} first.")
        resolved = resolve("lr_scheduler", scheduler_cls)
        if isinstance(resolved, type):
            scheduler = build_component("lr_scheduler", resolved, kwargs, group.optimizer)
        else:
            if kwargs:
                raise TypeError("set_lr_scheduler got a scheduler instance and construction arguments "
                                f"{sorted(kwargs)}; pass the class or its name instead.")
            if getattr(resolved, "optimizer", None) is not group.optimizer:
                raise ValueError(f"The scheduler instance is bound to another optimizer than group {group.name!r}'s.")
            scheduler = resolved
        group.lr_scheduler = scheduler
