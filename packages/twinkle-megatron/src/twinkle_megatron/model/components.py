"""set_loss / set_optimizer / set_lr_scheduler / metrics / template / processor / patches of MegatronModel.

The optimizer and scheduler are megatron-core's only (``'default'``); anything else is refused
with the accepted names before the group changes. A failing call leaves the group as it was.
"""

from __future__ import annotations

import copy
from typing import Any

from twinkle.metric import Metric
from twinkle.registry import resolve
from twinkle_megatron.model.drivers import make_driver
from twinkle_megatron.optim import OptimizerParamScheduler, check_scheduler, resolve_optimizer


def _build(kind: str, obj: Any, kwargs: dict[str, Any]) -> Any:
    resolved = resolve(kind, obj)
    if isinstance(resolved, type):
        try:
            return resolved(**kwargs)
        except TypeError as exc:
            raise TypeError(f"Could not construct {kind} {resolved.__name__} with {kwargs}: {exc}") from exc
    if kwargs:
        raise TypeError(f"{kind} {resolved!r} is already an instance; construction arguments {sorted(kwargs)} "
                        "cannot apply to it. Pass the class or its registered name instead.")
    return resolved


class ComponentsMixin:
    """Per-group components of a MegatronModel."""

    def set_loss(self, loss_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a loss (registered name, ``Loss`` class or instance, or a callable ``(inputs, outputs)``)."""
        group = self._group(adapter_name)
        loss = _build("loss", loss_cls, kwargs)
        if not callable(loss):
            raise TypeError(f"A loss must be callable as loss(inputs, outputs); got {type(loss).__name__}.")
        group.loss = loss

    def set_optimizer(self, optimizer_cls: Any = "default", *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use megatron-core's distributed optimizer (``'default'`` / ``'MegatronDistributedOptimizer'``).

        kwargs are its settings (``lr``, ``weight_decay``, ``adam_beta1``...). Other optimizers are refused.
        """
        group = self._group(adapter_name)
        settings = resolve_optimizer(optimizer_cls, kwargs)
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

    def add_metric(self, metric_cls: Any, is_training: bool | None = None, *, adapter_name: str | None = None,
                   **kwargs: Any) -> None:
        """Accumulate a metric in training forwards (True), evaluation forwards (False) or both (None)."""
        group = self._group(adapter_name)
        metric = _build("metric", metric_cls, kwargs)
        if not isinstance(metric, Metric):
            raise TypeError(f"add_metric needs a twinkle.metric.Metric; got {type(metric).__name__}.")
        if is_training in (True, None):
            group.train_metrics.append(metric)
        if is_training in (False, None):
            group.eval_metrics.append(metric if is_training is False else copy.deepcopy(metric))

    def calculate_metric(self, is_training: bool, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Numbers accumulated since the last call (loss, token_accuracy, grad_norm, lr, tokens/s, step)."""
        group = self._group(adapter_name)
        if kwargs:
            raise TypeError(f"calculate_metric() got unexpected arguments {sorted(kwargs)}.")
        lr = group.optimizer.lr if group.optimizer is not None else None
        return group.compute_metrics(is_training, lr=lr)

    def set_template(self, template_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        group = self._group(adapter_name)
        if isinstance(template_cls, (str, type)) and self.model_id is not None:
            kwargs.setdefault("model_id", self.model_id)
        group.template = _build("template", template_cls, kwargs)

    def set_processor(self, processor_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        group = self._group(adapter_name)
        processor = _build("processor", processor_cls, kwargs)
        if not callable(processor):
            raise TypeError(f"A processor must be callable on a list of rows; got {type(processor).__name__}.")
        group.processor = processor

    def apply_patch(self, patch_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply a patch to this rank's GPTModel: ``patch.apply(model)`` or ``patch(model)``."""
        self._group(adapter_name)
        patch = _build("patch", patch_cls, kwargs)
        apply = getattr(patch, "apply", None)
        if callable(apply):
            apply(self.gpt)
        elif callable(patch):
            patch(self.gpt)
        else:
            raise TypeError(f"A patch must have apply(model) or be callable; got {type(patch).__name__}.")
        self.patches.append(patch)
