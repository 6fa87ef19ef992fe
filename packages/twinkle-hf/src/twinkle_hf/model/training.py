"""forward / forward_only / calculate_loss / backward / forward_backward of TransformersModel."""

from __future__ import annotations

from typing import Any

import torch

from twinkle.loss import CrossEntropyLoss, InfoNCELoss, Loss
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.remote import remote_function
from twinkle_hf.model.inputs import collate, count_tokens, to_device
from twinkle_hf.model.tasks import check_task


def _fused_ce_loss() -> Loss:
    from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss

    return LigerFusedLinearCrossEntropyLoss()


_DEFAULT_LOSS = {"causal_lm": CrossEntropyLoss, "embedding": InfoNCELoss, "fused_lm_ce": _fused_ce_loss}
_FORWARD_OPTIONS = ("pooling",)


class TrainingMixin:
    """The computing half of the TwinkleModel API (see ``twinkle.model.base``)."""

    @remote_function(dispatch="slice_dp", collect="list")
    def forward(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                **kwargs: Any) -> Any:
        """Training-mode forward; outputs are kept for calculate_loss and counted by training metrics."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        return self._forward(group, inputs, task, True, kwargs)

    @remote_function(dispatch="slice_dp", collect="list")
    def forward_only(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                     **kwargs: Any) -> Any:
        """Eval-mode forward without gradients, counted by evaluation metrics."""
        group = self._group(adapter_name)
        with torch.no_grad():
            return self._forward(group, inputs, task, False, kwargs)

    @remote_function(collect="mean")
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> float:
        """The group's loss on the last forward (per-item mean over every data rank); kwargs go to the loss."""
        group = self._group(adapter_name)
        total, items = self._compute_loss(group, kwargs)
        return _mean(*self._global_loss_items(total, items))

    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last loss into the group's accumulating gradients (token-weighted)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        _no_kwargs("backward", kwargs)
        self._backward(group, None)

    def _backward(self, group: OptimizerGroup, global_items: float | None) -> None:
        """Token-weighted backward; under DDP/FSDP2 the divisor counts the tokens of every data rank."""
        loss = group.last_loss
        if loss is None or not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise RuntimeError(
                f"backward(adapter_name={group.name!r}) needs a loss with a graph: call forward(...) then "
                "calculate_loss() first (forward_only runs without gradients)."
            )
        items = group.last_loss_items
        if self.dist_plan.distributed:
            items = global_items if global_items is not None else self._global_loss_items(loss, items)[1]
        scaled = loss * self._grad_average_factor / group.backward_divisor(items) \
            if self.dist_plan.distributed else loss / group.backward_divisor(items)
        if group.scaler is not None:
            scaled = group.scaler.scale(scaled)
        scaled.backward()
        group.record_backward(items)
        group.last_loss = None
        group.last_outputs = None  # free the logits and the graph

    @remote_function(dispatch="slice_dp", collect="mean")
    def forward_backward(self, inputs: Any, *, adapter_name: str | None = None, task: str | None = None,
                         **kwargs: Any) -> float:
        """forward + calculate_loss + backward; returns the micro-batch's per-item (token) mean loss.

        Under DDP/FSDP2 the mean is over every data rank's tokens, so all ranks return the same number.
        """
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        self._forward(group, inputs, task, True, kwargs)
        total, items = self._compute_loss(group, {})
        value, count = self._global_loss_items(total, items)
        group.last_outputs = None  # metrics have seen the logits: free them before backward's peak
        self._backward(group, count if self.dist_plan.distributed else None)
        return _mean(value, count)

    # -------------------------------------------------------------- internals
    def _forward(self, group: OptimizerGroup, inputs: Any, task: str | None, training: bool,
                 kwargs: dict[str, Any]) -> Any:
        # no task given: the one the group's loss reads (a fused-CE loss needs hidden states, not logits)
        task = check_task(task if task is not None else getattr(group.loss, "task", "causal_lm"))
        unknown = sorted(set(kwargs) - set(_FORWARD_OPTIONS))
        if unknown:
            raise TypeError(f"Unknown forward options {unknown}; forward takes inputs=, adapter_name=, task= and "
                            f"{', '.join(_FORWARD_OPTIONS)}.")
        batch = to_device(collate(inputs, group, self._pad_token_id(group)), self.device)
        group.last_outputs = group.last_loss = None  # release the previous logits before allocating new ones
        self._ensure_wrapped()
        if self.model.training != training:
            self.model.train(training)
        self._activate(group)
        if training:
            self._set_grad_sync(group)
        with self.precision.autocast():
            outputs = self._run_forward(task, batch, kwargs.get("pooling"))
        group.last_task = task
        group.record_forward(batch, outputs, count_tokens(batch), training)
        return outputs

    def _compute_loss(self, group: OptimizerGroup, kwargs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        if group.last_outputs is None:
            raise RuntimeError(f"calculate_loss(adapter_name={group.name!r}) needs a forward first "
                               "(forward(inputs=...) or forward_only(inputs=...)).")
        loss_fn = group.loss if group.loss is not None else _DEFAULT_LOSS[group.last_task]()
        if isinstance(loss_fn, Loss):
            total, items = loss_fn.compute(group.last_inputs, group.last_outputs, **kwargs)
        else:  # a plain callable returns a per-batch mean: every micro-batch weighs the same
            total, items = loss_fn(group.last_inputs, group.last_outputs, **kwargs), 1
        if not isinstance(total, torch.Tensor) or total.numel() != 1:
            raise TypeError(f"The loss {type(loss_fn).__name__} returned {type(total).__name__}; "
                            "a loss must return a scalar tensor.")
        group.record_loss(total.reshape(()), items, group.last_is_training)
        counts = getattr(loss_fn, "last_token_counts", None)  # a fused CE loss counts correct tokens itself
        if counts is not None:
            for metric in group.train_metrics if group.last_is_training else group.eval_metrics:
                if hasattr(metric, "update_counts"):
                    metric.update_counts(*counts)
        if not group.last_is_training:
            group.last_outputs = None  # an evaluation loss has no backward: free the logits now
        return group.last_loss, items

    def _pad_token_id(self, group: OptimizerGroup) -> int:
        """Padding id for the default processor: the template's tokenizer, else the model config, else 0."""
        if group.template is not None and isinstance(getattr(group.template, "pad_token_id", None), int):
            return group.template.pad_token_id
        for source in (self._hf_model().config,):
            value = getattr(source, "pad_token_id", None)
            if isinstance(value, int):
                return value
        eos = getattr(self._hf_model().config, "eos_token_id", None)
        return eos if isinstance(eos, int) else 0


def _mean(total: Any, items: Any) -> float:
    value = total.detach() if isinstance(total, torch.Tensor) else total
    return float(value) / max(float(items), 1.0)


def _no_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}.")
