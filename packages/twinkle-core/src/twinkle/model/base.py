"""The TwinkleModel protocol: a model together with the training parts that belong to it.

A TwinkleModel owns, per *optimizer group*, an optimizer, an lr scheduler, a loss, metrics, a
template, an input processor, a gradient-accumulation count and a step counter. Each LoRA
adapter is its own group and the full model (no adapter) is one too, so every method takes
``adapter_name``; with a single group it may be omitted, and an unknown name is an error. The
full-model group is named ``'default'`` (``twinkle.model.optimizer_group.DEFAULT_GROUP``); groups
are :class:`twinkle.model.optimizer_group.OptimizerGroup` objects in ``model.optimizer_group``.
Anything that implements this class works with twinkle's DataLoader, Trainer and runtime,
whatever it wraps (HF Transformers, Megatron-Core, or a third party's engine).

``inputs`` (a batch: a dict of tensors, or a list of encoded rows) may be passed positionally or
as ``inputs=``: ``model.forward(batch)`` and ``model.forward(inputs=batch)`` are the same call.

Gradient accumulation contract: with ``gradient_accumulation_steps=N``, ``clip_grad_norm``,
``step``, ``zero_grad`` and ``lr_step`` act only on every N-th call and are no-ops in between, and
the applied gradient equals that of the N micro-batches taken as one token-weighted batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from twinkle.types import InputFeature, ModelOutput

if TYPE_CHECKING:
    from torch import Tensor

    from twinkle.loss import Loss


class TwinkleModel(ABC):
    """Abstract base of every twinkle model. See the module docstring for the group contract."""

    # ------------------------------------------------------------- computing
    @abstractmethod
    def forward(self, inputs: Mapping[str, Any], *, adapter_name: str | None = None, **kwargs: Any) -> Any:
        """Run a training-mode forward on ``inputs`` and return the model outputs (logits...).

        Outputs are kept for :meth:`calculate_loss` and counted by training metrics.
        """

    @abstractmethod
    def forward_only(self, inputs: Mapping[str, Any], *, adapter_name: str | None = None, **kwargs: Any) -> Any:
        """Run an inference-mode forward (no grad, eval mode) and return the outputs.

        Outputs are kept for :meth:`calculate_loss` and counted by evaluation metrics.
        """

    @abstractmethod
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> Any:
        """Apply the group's loss to the last forward's inputs and outputs; return the loss."""

    @abstractmethod
    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last calculated loss, accumulating gradients (scaled for accumulation)."""

    @abstractmethod
    def forward_backward(self, inputs: Mapping[str, Any], *, adapter_name: str | None = None, **kwargs: Any) -> Any:
        """forward + calculate_loss + backward in one call; returns the loss value.

        ``task=`` may select a forward flavour (e.g. ``'causal_lm'``, ``'embedding'``).
        """

    # ------------------------------------------------------------- stepping
    @abstractmethod
    def clip_grad_norm(
        self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None, **kwargs: Any
    ) -> Any:
        """Clip the group's gradients on an accumulation boundary; return the total norm before clipping.

        ``gradient_accumulation_steps`` may be passed here as in every stepping method.
        """

    @abstractmethod
    def step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply the optimizer on an accumulation boundary; a no-op between boundaries."""

    @abstractmethod
    def zero_grad(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Clear the group's gradients on an accumulation boundary."""

    @abstractmethod
    def lr_step(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Advance the group's lr scheduler on an accumulation boundary."""

    @abstractmethod
    def clip_grad_and_step(
        self, max_grad_norm: float = 1.0, norm_type: float = 2, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """clip_grad_norm + step + zero_grad + lr_step, gated together by gradient accumulation.

        A step whose loss or gradient norm is inf/NaN is skipped (nothing changes, ``skipped_steps``
        grows); ``max_consecutive_skips=`` bounds how many in a row before an error names the step.
        """

    # ---------------------------------------------------------- components
    @abstractmethod
    def set_loss(self, loss_cls: Loss | type[Loss] | str | Callable[[InputFeature, ModelOutput], Tensor], *,
                 adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a loss: a ``Loss`` subclass or instance, a registered name, or a callable
        ``fn(inputs: InputFeature, outputs: ModelOutput, **kwargs) -> tensor`` (the batch's mean loss;
        see :mod:`twinkle.types`); ``kwargs`` construct it."""

    @abstractmethod
    def set_optimizer(self, optimizer_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an optimizer (class, instance or registered name such as ``'AdamW'`` or ``'Muon'``)
        over the group's trainable parameters; ``kwargs`` (lr, ...) construct it."""

    @abstractmethod
    def set_lr_scheduler(self, scheduler_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an lr scheduler (class, instance or registered name) on the group's optimizer."""

    @abstractmethod
    def add_metric(
        self, metric_cls: Any, is_training: bool | None = None, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """Accumulate a metric in ``forward`` (``is_training=True``), ``forward_only`` (``False``)
        or both (``None``)."""

    @abstractmethod
    def calculate_metric(self, is_training: bool, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Compute, return and reset the accumulated metrics as plain numbers (loss, accuracy, lr...)."""

    @abstractmethod
    def set_template(self, template_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use a chat template (class, instance or registered name) to encode raw rows for this group."""

    @abstractmethod
    def set_processor(self, processor_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Use an input processor (padding, packing, device placement) for this group's batches."""

    @abstractmethod
    def apply_patch(self, patch_cls: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Apply a model patch (class, instance or registered name) to the wrapped model."""

    @abstractmethod
    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        """Add an adapter (a LoRA config, or a directory holding a saved adapter) as a new group.

        ``gradient_accumulation_steps=`` and other group options may be given here.
        """

    # --------------------------------------------------------- checkpoints
    @abstractmethod
    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None, **kwargs: Any) -> str:
        """Write a checkpoint directory ``output_dir/name`` and return its path.

        Weights are HF-loadable (``save_pretrained`` layout, or a PEFT adapter directory);
        ``save_optimizer=True`` adds optimizer, scheduler, scaler, RNG state and trainer_state.json
        with ``consumed_train_samples``. The directory appears under its final name only when complete.
        """

    @abstractmethod
    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Load weights (of the model or of one adapter) saved by :meth:`save`."""

    @abstractmethod
    def resume_from_checkpoint(
        self, checkpoint_dir: str, resume_only_model: bool = False, *, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, int]:
        """Restore a checkpoint written with ``save_optimizer=True``.

        Returns ``{'cur_step', 'consumed_train_samples', 'gradient_accumulation_steps'}``; with
        ``resume_only_model=True`` only weights are restored and the progress is still returned.
        """

    @abstractmethod
    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's weights as a flat ``name -> tensor`` dict (the adapter's only, for LoRA)."""

    @abstractmethod
    def get_train_configs(self, *, adapter_name: str | None = None, **kwargs: Any) -> str:
        """A readable summary of the training set-up (trainable parameters, precision, strategy, groups)."""


