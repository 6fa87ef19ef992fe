"""set_loss / set_optimizer / set_lr_scheduler / metrics / template / processor / patches.

Every component may be given as a registered name (resolved through ``twinkle.registry``), a
class (constructed with the call's kwargs) or a ready instance. A call that fails leaves the
group exactly as it was: the new component is built first and stored last.
"""

from __future__ import annotations

import copy
from typing import Any

from torch.optim import Optimizer

from twinkle.log import get_logger
from twinkle.metric import Metric
from twinkle.registry import resolve
from twinkle_hf.model.optim import build_optimizer

logger = get_logger("twinkle_hf")


def _build(kind: str, obj: Any, kwargs: dict[str, Any], *args: Any) -> Any:
    """Resolve ``obj`` of ``kind`` and construct it when it is a class."""
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
    """Per-group components of a TransformersModel."""

    def set_loss(self, loss_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a loss (registered name, ``Loss`` class or instance, or a callable ``(inputs, outputs)``)."""
        group = self._group(adapter_name)
        loss = _build("loss", loss_cls, kwargs)
        if not callable(loss):
            raise TypeError(f"A loss must be callable as loss(inputs, outputs); got {type(loss).__name__}.")
        group.loss = loss

    def set_optimizer(self, optimizer_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an optimizer over the group's trainable parameters (``'AdamW'``, ``'Muon'``, a class or instance).

        Muon takes the hidden 2-D matrices and an AdamW partner the rest (see ``optim.py``).
        Replacing an optimizer drops the group's lr scheduler, which was bound to the old one.
        """
        group = self._group(adapter_name)
        resolved = resolve("optimizer", optimizer_cls)
        if isinstance(resolved, Optimizer):
            if kwargs:
                raise TypeError(f"set_optimizer got an optimizer instance and arguments {sorted(kwargs)}; "
                                "pass the class or its name to construct it with arguments.")
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
            scheduler = _build("lr_scheduler", resolved, kwargs, group.optimizer)
        else:
            if kwargs:
                raise TypeError("set_lr_scheduler got a scheduler instance and construction arguments "
                                f"{sorted(kwargs)}; pass the class or its name instead.")
            if getattr(resolved, "optimizer", None) is not group.optimizer:
                raise ValueError(f"The scheduler instance is bound to another optimizer than group {group.name!r}'s.")
            scheduler = resolved
        group.lr_scheduler = scheduler

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
        lr = group.optimizer.param_groups[0]["lr"] if group.optimizer is not None else None
        return group.compute_metrics(is_training, lr=lr)

    def set_template(self, template_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a chat template (name, class or instance); it also supplies the tokenizer's pad id."""
        group = self._group(adapter_name)
        if isinstance(template_cls, (str, type)) and self.model_id is not None:
            kwargs.setdefault("model_id", self.model_id)
        group.template = _build("template", template_cls, kwargs)

    def set_processor(self, processor_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an input processor (padding, packing) to collate this group's lists of encoded rows."""
        group = self._group(adapter_name)
        processor = _build("processor", processor_cls, kwargs)
        if not callable(processor):
            raise TypeError(f"A processor must be callable on a list of rows; got {type(processor).__name__}.")
        group.processor = processor

    def apply_patch(self, patch_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply a patch to the wrapped model: ``patch.apply(model)`` or ``patch(model)``."""
        self._group(adapter_name)
        patch = _build("patch", patch_cls, kwargs)
        apply = getattr(patch, "apply", None)
        if callable(apply):
            apply(self.model)
        elif callable(patch):
            patch(self.model)
        else:
            raise TypeError(f"A patch must have apply(model) or be callable; got {type(patch).__name__}.")
        self.patches.append(patch)
