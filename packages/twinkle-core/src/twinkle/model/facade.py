"""ModelFacade: the TwinkleModel API over composed parts, the same for every backend.

A public method resolves ``adapter_name`` to its optimizer group once, collates the batch once, and
hands the group down to the part that does the work:

* the engine (:class:`twinkle.engine.Engine`): forward -> loss -> backward and the accumulation-gated
  step, written once;
* the backend (:class:`twinkle.engine.Backend`): runs a task on a batch, builds optimizers and adapters,
  wraps the model once (``parallelize``);
* the checkpoint manager (:class:`twinkle.checkpoint.manager.CheckpointManager`): save / load / resume;
* the tenant router of a multi-tenant model (:class:`twinkle.multi_lora.MultiLora`), which maps tenant
  names to their slots' groups.

A model class (``TransformersModel``, ``MegatronModel``...) only builds these parts in its constructor.
Wrapping for DDP/FSDP2/Megatron happens in one visible step, :meth:`parallelize`, which
``set_optimizer`` calls (after every adapter, before the first optimizer) and a forward never does.
Public methods run under ``self.lock``, so threads driving different tenants take turns call by call.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from twinkle.engine import Engine, Route
from twinkle.engine.backend import ModelBackend
from twinkle.log import get_logger
from twinkle.metric import Metric
from twinkle.model.base import TwinkleModel
from twinkle.model.components import build_callable, build_component
from twinkle.model.inputs import collate
from twinkle.model.optimizer_group import (
    DEFAULT_GROUP,
    OptimizerGroup,
    check_accumulation_steps,
    check_adapter_name,
    check_lr,
    lookup_group,
)
from twinkle.patch import Patch
from twinkle.remote import remote_function
from twinkle.utils.checks import check_no_kwargs

logger = get_logger()


def locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` under the model's lock (threads driving several tenants take turns)."""

    @functools.wraps(method)
    def call(self: ModelFacade, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return call


class ModelFacade(TwinkleModel):
    """The TwinkleModel API (see ``twinkle.model.base``) over an engine, a backend and a checkpoint manager.

    Subclasses build the parts in ``__init__`` and call :meth:`_attach`.
    """

    #: whether ``save(async_save=True)`` works (the checkpoint manager's backend state supports it)
    supports_async_save: bool = False

    def _attach(self, backend: ModelBackend, checkpoints: Any, groups: dict[str, OptimizerGroup],
                router: Callable[[str | None], OptimizerGroup] | None = None) -> None:
        """Compose the parts: the backend, its engine, the checkpoint manager, the groups and how names resolve."""
        self.backend = backend
        self.engine = Engine(backend)
        self.checkpoints = checkpoints
        self.optimizer_group: dict[str, OptimizerGroup] = groups
        self._router = router
        self.patches: list[Any] = []
        self.lock = threading.RLock()
        self._parallelized = False
        self.max_length: int | None = None

    # ------------------------------------------------------------------ parts
    @property
    def model(self) -> Any:
        """The underlying torch module (a ``PeftModel`` once adapters exist; this rank's GPTModel for Megatron)."""
        return self.backend.module

    @property
    def device(self) -> Any:
        return self.backend.device

    def _group(self, adapter_name: str | None = None) -> OptimizerGroup:
        """The group for ``adapter_name`` (a tenant or slot name on a multi-tenant model); never a fallback."""
        if self._router is not None:
            return self._router(adapter_name)
        return lookup_group(self.optimizer_group, adapter_name)

    def _new_group(self, name: str, is_adapter: bool = False, gradient_accumulation_steps: int = 1) -> OptimizerGroup:
        return OptimizerGroup(name, is_adapter=is_adapter, gradient_accumulation_steps=gradient_accumulation_steps,
                              scaler=self.backend.make_scaler())

    def parallelize(self) -> None:
        """Wrap the model for its parallel plan (DDP, FSDP2, Megatron DDP): once, after every adapter exists.

        ``set_optimizer`` calls it; call it yourself before an evaluation-only forward of a distributed
        model that never gets an optimizer. A no-op on one process.
        """
        with self.lock:
            if not self._parallelized:
                self.backend.parallelize()
                self._parallelized = True

    def _require_parallelized(self, what: str) -> None:
        if not self._parallelized and self.backend.needs_parallelize:
            raise RuntimeError(f"{what} on a distributed model before it was wrapped: call set_optimizer(...) (or "
                               "model.parallelize() for evaluation only) first; wrapping happens once, after every "
                               "adapter is added.")

    def _batch(self, group: OptimizerGroup, inputs: Any, task: str, options: dict[str, Any]) -> list[dict[str, Any]]:
        """The checked, collated batch in the backend's layout (one or more pieces), on its device."""
        backend = self.backend
        batch = collate(inputs, group, backend.pad_token_id(group), backend.vocab_size, self.max_length)
        return backend.prepare(batch, group, task, options)

    def _task(self, group: OptimizerGroup, task: str | None, training: bool = False) -> str:
        """No task given: the one the group's loss reads (a fused-CE loss needs hidden states, not logits); a
        training step without a loss set takes the backend's default loss task (``training_task``, where a
        backend has one: the fused linear cross-entropy on CUDA)."""
        if task is None and group.loss is None and training:
            task = getattr(self.backend, "training_task", "causal_lm")
        return self.backend.check_task(task if task is not None else getattr(group.loss, "task", "causal_lm"))

    # ============================================================== computing
    @remote_function(dispatch="slice_dp", collect="list")
    @locked
    def forward(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                **kwargs: Any) -> Any:
        """Training-mode forward; outputs are kept for calculate_loss and counted by training metrics."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        return self._forward(group, inputs, task, True, kwargs)

    @remote_function(dispatch="slice_dp", collect="list")
    @locked
    def forward_only(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                     **kwargs: Any) -> Any:
        """Eval-mode forward without gradients, counted by evaluation metrics."""
        import torch

        group = self._group(adapter_name)
        with torch.no_grad():
            return self._forward(group, inputs, task, False, kwargs)

    def _forward(self, group: OptimizerGroup, inputs: Any, task: str | None, training: bool,
                 options: dict[str, Any]) -> Any:
        task = self._task(group, task)
        pieces = self._batch(group, inputs, task, options)
        batch = pieces[0] if len(pieces) == 1 else joined(pieces)  # micro-batches (Megatron's) are forward_backward's
        self._require_parallelized("forward")
        return self.engine.forward([Route(group)], batch, task, training, options)

    @remote_function(collect="mean")
    @locked
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> Any:
        """The group's loss on the last forward (per-item mean over every data rank); kwargs go to the loss."""
        return self.engine.calculate_loss(self._group(adapter_name), kwargs)

    @locked
    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last loss into the group's accumulating gradients (token-weighted)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        check_no_kwargs("backward", kwargs)
        self.engine.backward(group)

    @remote_function(dispatch="slice_dp", collect="mean")
    @locked
    def forward_backward(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                         **kwargs: Any) -> Any:
        """forward + calculate_loss + backward; returns the micro-batch's per-item (token) mean loss.

        Under DDP/FSDP2 the mean is over every data rank's tokens, so all ranks return the same number.
        The number is a :class:`~twinkle.engine.LazyFloat`: nothing waits for the device
        until it is read.
        """
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        task = self._task(group, task, training=True)
        pieces = self._batch(group, inputs, task, kwargs)
        self._require_parallelized("forward_backward")
        return self.engine.forward_backward([Route(group)], pieces, task, kwargs)[group.name]

    @remote_function(collect="flatten")
    @locked
    def get_loss_outputs(self, *, adapter_name: str | None = None) -> list[dict[str, Any]]:
        """Per-sample outputs of the group's last loss (Tinker's ``loss_fn_outputs``), in batch order.

        Each dict holds ``logprobs``: the log-probability of every target token of the sample (one per
        input position of the sample, padding excluded), plus per-sequence values the loss adds
        (``reward`` for preference losses). Empty when the last loss computes none (``CrossEntropyLoss``;
        use ``'cross_entropy'`` for SFT with log-probabilities). Under torchrun each rank returns its own.
        """
        outputs = self.engine.loss_outputs.get(self._group(adapter_name).name)
        return outputs.per_sample() if outputs is not None else []

    # =============================================================== stepping
    def _stepping_group(self, method: str, adapter_name: str | None, kwargs: dict[str, Any]) -> OptimizerGroup:
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        group.take_skip_limit(kwargs)
        if kwargs:
            raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}; it takes adapter_name=, "
                            "gradient_accumulation_steps= and max_consecutive_skips=.")
        return group

    @locked
    def clip_grad_norm(self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None,
                       **kwargs: Any) -> float | None:
        """Clip the group's gradients on a boundary; returns the total norm before clipping (else None)."""
        group = self._stepping_group("clip_grad_norm", adapter_name, kwargs)
        return self.engine.clip_grad_norm(group, max_grad_norm, norm_type)

    @locked
    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on a boundary, unless the loss or gradients are inf/NaN (the step is then skipped)."""
        self.engine.step(self._stepping_group("step", adapter_name, kwargs))

    @locked
    def zero_grad(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Clear the group's gradients right after a step (or on a boundary, dropping them)."""
        self.engine.zero_grad(self._stepping_group("zero_grad", adapter_name, kwargs))

    @locked
    def lr_step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Advance the group's lr scheduler once per optimizer step."""
        self.engine.lr_step(self._stepping_group("lr_step", adapter_name, kwargs))

    @locked
    def clip_grad_and_step(self, max_grad_norm: float | None = 1.0, norm_type: float = 2, *,
                           adapter_name: str | None = None, **kwargs: Any) -> None:
        """clip_grad_norm + step + zero_grad + lr_step on a boundary; ``max_grad_norm=None`` skips clipping."""
        group = self._stepping_group("clip_grad_and_step", adapter_name, kwargs)
        self.engine.clip_grad_and_step(group, max_grad_norm, norm_type)

    @locked
    def set_optimizer_params(self, *, adapter_name: str | None = None, **params: Any) -> dict[str, Any]:
        """Change the group's optimizer hyper-parameters in place (``lr=``, ``betas=``, ``eps=``, ``weight_decay=``).

        Unlike ``set_optimizer`` the optimizer keeps its state (moments, step counts): this is how a
        client-driven schedule (the Tinker API sends the Adam parameters with every step) changes them.
        Every param group gets the values; a name no param group has is a TypeError and nothing changes.
        An lr scheduler, if any, sets ``lr`` again at its next step. Returns the values now in effect.
        """
        group = self._group(adapter_name)
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer(..., "
                               f"adapter_name={group.name!r}) first.")
        param_groups = list(group.optimizer.param_groups)
        unknown = sorted(k for k in params if any(k not in g for g in param_groups))
        if unknown:
            known = sorted(k for k in param_groups[0] if k != "params")
            raise TypeError(f"The optimizer of group {group.name!r} ({type(group.optimizer).__name__}) has no "
                            f"hyper-parameters {unknown}; it has {known}.")
        for param_group in param_groups:
            param_group.update(params)
        return {k: param_groups[0][k] for k in params}

    # ============================================================= components
    @locked
    def set_loss(self, loss_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a loss (registered name, ``Loss`` class or instance, or a callable ``(inputs, outputs)``)."""
        self._group(adapter_name).loss = build_callable("loss", loss_cls, kwargs, "as loss(inputs, outputs)")

    @locked
    def set_optimizer(self, optimizer_cls: Any = "default", *, adapter_name: str | None = None,
                      **kwargs: Any) -> None:
        """Use an optimizer over the group's trainable parameters (a class, an instance or a registered name:
        ``'AdamW'``, ``'Muon'``; ``'default'`` is the backend's own). ``kwargs`` (lr, ...) construct it.

        This is where the model is wrapped for its parallel plan (:meth:`parallelize`), so every adapter
        must exist by now. Replacing an optimizer drops the group's lr scheduler, which was bound to the old one.
        """
        group = self._group(adapter_name)
        if "lr" in kwargs:
            check_lr(kwargs["lr"])
        self.parallelize()
        others = {name: self.backend.parameters(g) for name, g in self.optimizer_group.items() if g is not group}
        optimizer = self.backend.build_optimizer(group, optimizer_cls, dict(kwargs), others)
        if group.lr_scheduler is not None:
            logger.warning("set_optimizer on group %r replaced the optimizer; its lr scheduler was dropped, "
                           "call set_lr_scheduler again.", group.name)
            group.lr_scheduler = None
        group.optimizer = optimizer

    @locked
    def set_lr_scheduler(self, scheduler_cls: Any = "default", *, adapter_name: str | None = None,
                         **kwargs: Any) -> None:
        """Use an lr scheduler on the group's optimizer; it advances once per optimizer step.

        ``num_training_steps`` of the warm-up schedulers therefore counts optimizer steps.
        """
        group = self._group(adapter_name)
        if group.optimizer is None:
            raise RuntimeError(f"set_lr_scheduler needs an optimizer: call set_optimizer(...) for group "
                               f"{group.name!r} first.")
        group.lr_scheduler = self.backend.build_lr_scheduler(group, scheduler_cls, dict(kwargs))

    @locked
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

    @locked
    def calculate_metric(self, is_training: bool, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Numbers accumulated since the last call (loss, token_accuracy, grad_norm, lr, tokens/s, step), equal on
        every rank (a collective under torchrun: call it on all ranks)."""
        from twinkle import collective

        group = self._group(adapter_name)
        check_no_kwargs("calculate_metric", kwargs)
        lr = group.optimizer.param_groups[0]["lr"] if group.optimizer is not None else None
        result = group.compute_metrics(is_training, lr=lr)
        if collective.active(collective.data_group()):
            rate = result.get("tokens_per_second")
            present, total = collective.sum_floats([rate is not None, rate or 0.0], collective.data_group())
            if present:
                result["tokens_per_second"] = total  # every data rank's tokens over the same wall time
        return result

    @locked
    def set_template(self, template_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a chat template (name, class or instance); by name or class it loads this model's tokenizer."""
        group = self._group(adapter_name)
        if isinstance(template_cls, (str, type)) and self.model_id is not None:
            kwargs.setdefault("model_id", self.model_id)
        group.template = build_component("template", template_cls, kwargs)

    @locked
    def set_processor(self, processor_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an input processor (padding, packing) to collate this group's lists of encoded rows."""
        self._group(adapter_name).processor = build_callable("processor", processor_cls, kwargs,
                                                             "on a list of rows")

    @locked
    def apply_patch(self, patch_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply a patch (``twinkle.patch.Patch``, its name or class) to the wrapped model.

        Objects that are not ``Patch`` subclasses work too: ``patch.apply(module)`` or ``patch(module)``.
        A patch changes the whole model, so no group is needed (a multi-tenant model has none at first);
        an ``adapter_name`` given is checked.
        """
        if adapter_name is not None:
            self._group(adapter_name)
        patch = build_component("patch", patch_cls, kwargs)
        target = self.backend.patch_target()
        apply = getattr(patch, "apply", None)
        if isinstance(patch, Patch):
            patch.apply(target)
            patch.on_model(self)
        elif callable(apply):
            apply(target)
        elif callable(patch):
            patch(target)
        else:
            raise TypeError(f"A patch must have apply(model) or be callable; got {type(patch).__name__}.")
        self.patches.append(patch)

    @locked
    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        """Add an adapter (a LoRA config, or a directory holding a saved adapter) as a new group.

        ``gradient_accumulation_steps=`` sets the new group's accumulation; a backend may take more
        options (a VL model's ``vision_tower=``/``projector=``). Everything is checked before the model is
        touched, so a bad call leaves the model as it was. Adapters come before the first ``set_optimizer``
        (the model is wrapped there). The first adapter replaces the full-model group (its template,
        processor and loss carry over).
        """
        if self._router is not None:
            raise TypeError(f"{type(self).__name__} adapters are tenant slots: use "
                            "model.acquire_lora(tenant, LoraConfig(...)) or load_lora(tenant, dir).")
        options = ("gradient_accumulation_steps", *self.backend.adapter_options)
        unknown = sorted(set(kwargs) - set(options))
        if unknown:
            raise TypeError(f"add_adapter_to_model got unknown options {unknown}; it takes {', '.join(options)}.")
        accumulation = check_accumulation_steps(kwargs.pop("gradient_accumulation_steps", 1))
        check_adapter_name(adapter_name)
        if adapter_name in self.optimizer_group and self.optimizer_group[adapter_name].is_adapter:
            raise ValueError(f"An adapter named {adapter_name!r} already exists; pick another name.")
        if self._parallelized and self.backend.needs_parallelize:
            raise RuntimeError(f"add_adapter_to_model({adapter_name!r}) after the model was wrapped for its parallel "
                               "plan: add every adapter before the first set_optimizer (the adapter must change the "
                               "model before DDP/FSDP2 take its parameters).")
        inherited = self._full_group_defaults()
        self.backend.add_adapter(adapter_name, config_or_dir, kwargs)
        full = self.optimizer_group.get(DEFAULT_GROUP)
        if full is not None and not full.is_adapter:
            del self.optimizer_group[DEFAULT_GROUP]
        group = self._new_group(adapter_name, is_adapter=True, gradient_accumulation_steps=accumulation)
        for attr in ("template", "processor", "loss"):
            setattr(group, attr, inherited.get(attr))
        self.optimizer_group[adapter_name] = group
        self.backend.adapters_changed(list(self.optimizer_group.values()))

    def _full_group_defaults(self) -> dict[str, Any]:
        """What the full-model group hands to the first adapter; refuse if it is already training."""
        full = self.optimizer_group.get(DEFAULT_GROUP)
        if full is None or full.is_adapter:
            return {}
        if full.optimizer is not None or full.total_micro_steps:
            raise RuntimeError("The full model is already set up for training (it has an optimizer or has taken "
                               "steps); add adapters before calling set_optimizer/forward_backward on the full model.")
        return {"template": full.template, "processor": full.processor, "loss": full.loss}

    # ============================================================ checkpoints
    @locked
    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> Any:
        """Write ``output_dir/name`` (``output_dir`` defaults to ``./output``) and return its path.

        ``save_optimizer=True`` adds the optimizer, scheduler, scaler and RNG states (an exact resume);
        ``consumed_train_samples=`` goes to ``trainer_state.json``. An existing directory of that name is
        replaced only if it is a twinkle checkpoint (or ``overwrite=True``); NaN/inf trainable weights are
        refused, on every rank together, unless ``allow_non_finite=True``. ``async_save=True`` (where
        supported) returns a :class:`twinkle.checkpoint.PendingSave` at once: the state is copied to host
        memory and written in the background; ``pending.wait()`` (every rank) puts it under its final name.
        """
        return self.checkpoints.save(self._group(adapter_name), name, output_dir, **kwargs)

    @locked
    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> None:
        """Load weights saved by :meth:`save` into the group (``name`` is a path when output_dir is None)."""
        check_no_kwargs("load", kwargs)
        self.checkpoints.load(self._group(adapter_name), name, output_dir)

    @locked
    def resume_from_checkpoint(self, checkpoint_dir: str, resume_only_model: bool = False, *,
                               adapter_name: str | None = None, skip_checkpoint_validation: bool = False,
                               pre_manifest: bool = False, **kwargs: Any) -> dict[str, int]:
        """Restore weights (+ optimizer, scheduler, scaler, RNG unless ``resume_only_model``) and progress.

        Every file is read and checked before anything is changed, its bytes against ``manifest.json``'s
        checksums unless ``skip_checkpoint_validation=True`` (a warning; sizes are still checked); returns the
        restored progress. A directory without ``manifest.json`` is refused unless ``pre_manifest=True`` (a
        checkpoint saved before manifests existed: structural checks only, with a warning).
        """
        check_no_kwargs("resume_from_checkpoint", kwargs)
        return self.checkpoints.resume(self._group(adapter_name), checkpoint_dir, resume_only_model,
                                       skip_checkpoint_validation, pre_manifest)

    @locked
    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's weights: the adapter's (PEFT file keys) or the full model's."""
        check_no_kwargs("get_state_dict", kwargs)
        return self.checkpoints.state_dict(self._group(adapter_name))

    @locked
    def get_train_configs(self, *, adapter_name: str | None = None, **kwargs: Any) -> str:
        """Model, precision, strategy, device and, per group, trainable parameters and components."""
        groups = [self._group(adapter_name)] if adapter_name is not None else list(self.optimizer_group.values())
        lines = self.backend.describe()
        total = sum(p.numel() for p in self.backend.module.parameters())
        for group in groups:
            trainable = sum(p.numel() for p in self.backend.parameters(group))
            kind = "LoRA adapter" if group.is_adapter else "full model"
            lines.append(f"  group {group.name!r} ({kind}): trainable {trainable:,} "
                         f"({100.0 * trainable / max(total, 1):.4f}%), gradient_accumulation_steps="
                         f"{group.gradient_accumulation_steps}, cur_step={group.cur_step}")
            lines.extend(self.backend.describe_group(group))
            for label, value in (("optimizer", group.optimizer), ("lr_scheduler", group.lr_scheduler),
                                 ("loss", group.loss), ("template", group.template),
                                 ("processor", group.processor), ("scaler", group.scaler)):
                if value is not None:
                    lines.append(f"    {label}: {type(value).__name__}")
        return "\n".join(lines)


def joined(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """Row pieces of one batch (a backend's micro-batches) as the one batch a forward runs."""
    import torch

    rows = pieces[0]["input_ids"].shape[0]
    return {k: torch.cat([p[k] for p in pieces]) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rows
            else v for k, v in pieces[0].items()}


def routes_of(groups: Mapping[str, OptimizerGroup], ranges: Mapping[str, tuple[int, int]]) -> list[Route]:
    """One route per tenant over its row range of a stacked batch."""
    return [Route(groups[t], slice(start, stop)) for t, (start, stop) in ranges.items()]
