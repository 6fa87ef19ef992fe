"""forward / forward_only / calculate_loss / backward / forward_backward of TransformersModel."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from twinkle.loss import CrossEntropyLoss, InfoNCELoss, Loss, TokenOutputs
from twinkle.loss.token_inputs import needs_reference, reference_logprobs
from twinkle.model.inputs import collate, count_tokens, to_device
from twinkle.model.losses import compute_loss
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.remote import remote_function
from twinkle.utils.checks import check_no_kwargs
from twinkle.utils.lazy_float import LazyFloat
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
    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> LazyFloat:
        """The group's loss on the last forward (per-item mean over every data rank); kwargs go to the loss."""
        group = self._group(adapter_name)
        total, items = self._compute_loss(group, kwargs)
        return LazyFloat(*self._global_loss_items(total, items))

    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last loss into the group's accumulating gradients (token-weighted)."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        check_no_kwargs("backward", kwargs)
        self._backward(group, None)

    def _backward(self, group: OptimizerGroup, global_items: Any) -> None:
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
                         **kwargs: Any) -> LazyFloat:
        """forward + calculate_loss + backward; returns the micro-batch's per-item (token) mean loss.

        Under DDP/FSDP2 the mean is over every data rank's tokens, so all ranks return the same number.
        The number is a :class:`~twinkle.utils.lazy_float.LazyFloat`: nothing waits for the device
        until it is read.
        """
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        self._forward(group, inputs, task, True, kwargs)
        total, items = self._compute_loss(group, {})
        value, count = self._global_loss_items(total, items)
        group.last_outputs = None  # metrics have seen the logits: free them before backward's peak
        self._backward(group, count if self.dist_plan.distributed else None)
        return LazyFloat(value, count)

    # -------------------------------------------------------------- internals
    def _forward(self, group: OptimizerGroup, inputs: Any, task: str | None, training: bool,
                 kwargs: dict[str, Any]) -> Any:
        # no task given: the one the group's loss reads (a fused-CE loss needs hidden states, not logits)
        task = check_task(task if task is not None else getattr(group.loss, "task", "causal_lm"))
        unknown = sorted(set(kwargs) - set(_FORWARD_OPTIONS))
        if unknown:
            raise TypeError(f"Unknown forward options {unknown}; forward takes inputs=, adapter_name=, task= and "
                            f"{', '.join(_FORWARD_OPTIONS)}.")
        batch = to_device(collate(inputs, group, self._pad_token_id(group), self._vocab_size()), self.device)
        group.last_outputs = group.last_loss = None  # release the previous logits before allocating new ones
        self._ensure_wrapped()
        if self.model.training != training:
            self.model.train(training)
        self._activate(group)
        if task == "causal_lm" and needs_reference(group.loss, batch):
            batch = {**batch, "ref_logprobs": self._reference_logprobs(group, batch)}
        if training:
            self._set_grad_sync(group)
        with self.precision.autocast():
            outputs = self._run_forward(task, batch, kwargs.get("pooling"))
        group.last_task = task
        group.record_forward(batch, outputs, count_tokens(batch), training)
        return outputs

    def _compute_loss(self, group: OptimizerGroup, kwargs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        total, items = compute_loss(group, group.last_inputs, group.last_outputs, kwargs, group.last_is_training,
                                    _DEFAULT_LOSS[group.last_task])
        group.record_loss(total, items, group.last_is_training)
        self._keep_loss_outputs(group)
        if not group.last_is_training:
            group.last_outputs = None  # an evaluation loss has no backward: free the logits now
        return group.last_loss, items

    # ------------------------------------------------------- RL: reference and loss outputs
    @remote_function(collect="flatten")
    def get_loss_outputs(self, *, adapter_name: str | None = None) -> list[dict[str, torch.Tensor]]:
        """Per-sample outputs of the group's last loss (Tinker's ``loss_fn_outputs``), in batch order.

        Each dict holds ``logprobs``: the log-probability of every target token of the sample (one per
        input position of the sample, padding excluded), plus per-sequence values the loss adds
        (``reward`` for preference losses). Empty when the last loss computes none (``CrossEntropyLoss``;
        use ``'cross_entropy'`` for SFT with log-probabilities). Under torchrun each rank returns its own.
        """
        group = self._group(adapter_name)
        outputs = self._loss_outputs().get(group.name)
        return outputs.per_sample() if outputs is not None else []

    def _loss_outputs(self) -> dict[str, TokenOutputs | None]:
        if "_last_loss_outputs" not in self.__dict__:
            self._last_loss_outputs: dict[str, TokenOutputs | None] = {}
        return self._last_loss_outputs

    def _keep_loss_outputs(self, group: OptimizerGroup) -> None:
        """What the group's loss just computed per token (RL/preference losses), for :meth:`get_loss_outputs`."""
        outputs = getattr(group.loss, "last_outputs", None)  # the default losses keep none
        self._loss_outputs()[group.name] = outputs if isinstance(outputs, TokenOutputs) else None

    def _reference_logprobs(self, group: OptimizerGroup, batch: dict[str, Any]) -> torch.Tensor:
        """``ref_logprobs`` from a no-grad, eval-mode forward of the reference policy (adapters disabled)."""
        training = self.model.training
        try:
            self.model.train(False)
            with torch.no_grad(), self._reference_mode(group), self.precision.autocast():
                outputs = self._run_task_unwrapped("causal_lm", batch, None)
            return reference_logprobs(batch, outputs.logits)
        finally:
            self.model.train(training)

    @contextmanager
    def _reference_mode(self, group: OptimizerGroup) -> Any:
        """The reference policy: the base model under the group's LoRA adapter, which is switched off."""
        if not group.is_adapter:
            raise ValueError(
                f"The loss of group {group.name!r} needs reference log-probabilities (a KL penalty or DPO) but the "
                "group trains the full model, so the reference would be a second, frozen copy: compute them with "
                "TorchSampler(reference_model).compute_logprobs(...) and put them in the batch as 'ref_logprobs', "
                "or train a LoRA adapter (its reference is the base model, no copy).")
        with self.model.disable_adapter():
            yield

    def _vocab_size(self) -> int | None:
        """Rows of the input embedding: token ids must be below it (None when the model does not say)."""
        try:
            embeddings = self._hf_model().get_input_embeddings()
        except (AttributeError, NotImplementedError):
            return None
        embeddings = getattr(embeddings, "base_layer", embeddings)  # a LoRA-wrapped embedding
        return getattr(embeddings, "num_embeddings", None)

    def _pad_token_id(self, group: OptimizerGroup) -> int:
        """Padding id for the default processor: the template's tokenizer, else the model config, else 0."""
        if group.template is not None and isinstance(getattr(group.template, "pad_token_id", None), int):
            return group.template.pad_token_id
        config = self._hf_model().config
        for value in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)):
            if isinstance(value, int):
                return value
        return 0
