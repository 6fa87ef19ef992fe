"""Per-group components every backend handles the same way: loss, metrics, template, processor, patches.

Each may be given as a registered name (resolved through ``twinkle.registry``), a class
(constructed with the call's kwargs) or a ready instance. A call that fails leaves the group
exactly as it was: the new component is built first and stored last. Backends add their own
``set_optimizer`` / ``set_lr_scheduler`` and say where patches apply and how to read the lr.
"""

from __future__ import annotations

import copy
from typing import Any

from twinkle.metric import Metric
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.patch import Patch
from twinkle.registry import resolve
from twinkle.utils.checks import check_no_kwargs


def build_component(kind: str, obj: Any, kwargs: dict[str, Any], *args: Any) -> Any:
    """Resolve ``obj`` of ``kind`` and construct it (with ``args`` then ``kwargs``) when it is a class."""
    resolved = resolve(kind, obj)
    if isinstance(resolved, type):
        try:
            return resolved(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"Could not construct {kind} {resolved.__name__} with {kwargs}: {exc}") from exc
    if kwargs:
        raise TypeError(f"{kind} {resolved!r} is already an instance; construction arguments {sorted(kwargs)} "
                        "cannot apply to it. Pass the class or its registered name instead.")
    return resolved


class ComponentsMixin:
    """The backend-neutral half of a TwinkleModel's per-group components.

    Needs from the backend: ``_group(adapter_name) -> OptimizerGroup``, ``model_id``, ``patches``,
    ``_patch_target()`` (the module patches apply to) and ``_group_lr(group)``.
    """

    def _patch_target(self) -> Any:
        return self.model

    def _group_lr(self, group: OptimizerGroup) -> float | None:
        return group.optimizer.param_groups[0]["lr"] if group.optimizer is not None else None

    def set_loss(self, loss_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a loss (registered name, ``Loss`` class or instance, or a callable ``(inputs, outputs)``)."""
        group = self._group(adapter_name)
        loss = build_component("loss", loss_cls, kwargs)
        if not callable(loss):
            raise TypeError(f"A loss must be callable as loss(inputs, outputs); got {type(loss).__name__}.")
        group.loss = loss

    def add_metric(self, metric_cls: Any, is_training: bool | None = None, *, adapter_name: str | None = None,
                   **kwargs: Any) -> None:
        """Accumulate a metric in training forwards (True), evaluation forwards (False) or both (None)."""
        group = self._group(adapter_name)
        metric = build_component("metric", metric_cls, kwargs)
        if not isinstance(metric, Metric):
            raise TypeError(f"add_metric needs a twinkle.metric.Metric; got {type(metric).__name__}.")
        if is_training in (True, None):
            group.train_metrics.append(metric)
        if is_training in (False, None):
            group.eval_metrics.append(metric if is_training is False else copy.deepcopy(metric))

    def calculate_metric(self, is_training: bool, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Numbers accumulated since the last call (loss, token_accuracy, grad_norm, lr, tokens/s, step)."""
        group = self._group(adapter_name)
        check_no_kwargs("calculate_metric", kwargs)
        return group.compute_metrics(is_training, lr=self._group_lr(group))

    def set_template(self, template_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a chat template (name, class or instance); by name or class it loads this model's tokenizer."""
        group = self._group(adapter_name)
        if isinstance(template_cls, (str, type)) and self.model_id is not None:
            kwargs.setdefault("model_id", self.model_id)
        group.template = build_component("template", template_cls, kwargs)

    def set_processor(self, processor_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an input processor (padding, packing) to collate this group's lists of encoded rows."""
        group = self._group(adapter_name)
        processor = build_component("processor", processor_cls, kwargs)
        if not callable(processor):
            raise TypeError(f"A processor must be callable on a list of rows; got {type(processor).__name__}.")
        group.processor = processor

    def apply_patch(self, patch_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply a patch (``twinkle.patch.Patch``, its name or class) to the wrapped model.

        Objects that are not ``Patch`` subclasses work too: ``patch.apply(module)`` or ``patch(module)``.
        A patch changes the whole model, so no group is needed (a multi-tenant model has none at first);
        an ``adapter_name`` given is checked.
        """
        if adapter_name is not None:
            self._group(adapter_name)
        patch = build_component("patch", patch_cls, kwargs)
        apply = getattr(patch, "apply", None)
        if isinstance(patch, Patch):
            patch.apply(self._patch_target())
            patch.on_model(self)
        elif callable(apply):
            apply(self._patch_target())
        elif callable(patch):
            patch(self._patch_target())
        else:
            raise TypeError(f"A patch must have apply(model) or be callable; got {type(patch).__name__}.")
        self.patches.append(patch)
