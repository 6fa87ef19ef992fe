"""forward / forward_only / calculate_loss / backward / forward_backward of MegatronModel.

The eager path (one forward, twinkle's loss, one backward) runs wherever the whole model is on
this rank (pp_size=1): it is what runs on CPU. On CUDA, ``forward_backward`` goes through
megatron-core's forward-backward schedule (``schedule.py``), which also covers pipeline stages.
Backward always runs on the loss *sum*; the accumulation boundary divides by the window's tokens
(``drivers.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model.inputs import attention_mask, check_plain_causal, collate, count_tokens, to_device


class TrainingMixin:
    """The computing half of the TwinkleModel API."""

    def forward(self, *, inputs: Any, adapter_name: str | None = None, task: str = "causal_lm", **kwargs: Any) -> Any:
        """Training-mode forward; returns ``{'logits': (batch, seq, vocab)}`` kept for calculate_loss."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        return self._forward(group, inputs, task, True, kwargs)

    def forward_only(self, *, inputs: Any, adapter_name: str | None = None, task: str = "causal_lm",
                     **kwargs: Any) -> Any:
        """Eval-mode forward without gradients, counted by evaluation metrics."""
        group = self._group(adapter_name)
        with torch.no_grad():
            return self._forward(group, inputs, task, False, kwargs)

    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> float:
        """The group's loss on the last forward (per-item mean, as a number); kwargs go to the loss."""
        group = self._group(adapter_name)
        total, items = self._compute_loss(group, group.last_inputs, group.last_outputs, kwargs)
        group.record_loss(total.reshape(()), items, group.last_is_training)
        return _mean(total, items)

    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last loss sum into the group's accumulating gradients."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        if kwargs:
            raise TypeError(f"backward() got unexpected arguments {sorted(kwargs)}.")
        loss = group.last_loss
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise RuntimeError(f"backward(adapter_name={group.name!r}) needs a loss with a graph: call forward(...) "
                               "then calculate_loss() first (forward_only runs without gradients).")
        scale = getattr(group.optimizer, "loss_scale", None)
        (loss * scale() if scale is not None else loss).backward()
        group.record_backward(group.last_loss_items)
        group.last_loss = None
        group.last_outputs = None

    def forward_backward(self, *, inputs: Any, adapter_name: str | None = None, task: str = "causal_lm",
                         **kwargs: Any) -> float:
        """forward + loss + backward; returns the per-token mean loss of ``inputs``.

        ``num_microbatches=`` splits ``inputs`` by rows (the gradient is the same: backward runs on
        loss sums). On CUDA this runs megatron-core's forward-backward schedule.
        """
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        micro = kwargs.pop("num_microbatches", None)
        _check_task(task)
        if micro is None and self.megatron_kwargs.micro_batch_size is not None:  # the constructor's setting
            micro = self.megatron_kwargs.num_microbatches(len(inputs["input_ids"] if isinstance(inputs, dict)
                                                              else inputs))
        micro = int(micro or 1)
        if self.device_type == "cuda":
            from twinkle_megatron.model.schedule import schedule_forward_backward

            return schedule_forward_backward(self, group, inputs, micro, kwargs)
        if kwargs:
            raise TypeError(f"forward_backward got unexpected arguments {sorted(kwargs)}.")
        from twinkle_megatron.model.schedule import split_rows

        loss_sum, items_sum = 0.0, 0
        for batch in split_rows(self._prepare(group, inputs), micro):
            outputs = self._forward_batch(group, batch, task, True)
            total, items = self._compute_loss(group, batch, outputs, {})
            group.record_loss(total.detach(), items, True)
            total.backward()
            loss_sum, items_sum = loss_sum + float(total.detach()), items_sum + items
        group.record_backward(items_sum)
        group.last_loss, group.last_outputs = None, None
        return loss_sum / max(float(items_sum), 1.0)

    # -------------------------------------------------------------- internals
    def _prepare(self, group: OptimizerGroup, inputs: Any) -> dict[str, Any]:
        return to_device(collate(inputs, group, self._pad_token_id(group)), self.device)

    def _mask(self, batch: dict[str, Any]) -> torch.Tensor | None:
        if self.use_te:
            check_plain_causal(batch)
            return None
        return attention_mask(batch, self.args.sliding_window)

    def _run(self, module: torch.nn.Module, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        logits = module(batch["input_ids"], None, self._mask(batch), runtime_gather_output=True)
        return {"logits": logits[..., : self.vocab_size]}

    def _forward(self, group: OptimizerGroup, inputs: Any, task: str, training: bool, kwargs: dict[str, Any]) -> Any:
        _check_task(task)
        if kwargs:
            raise TypeError(f"Unknown forward options {sorted(kwargs)}; forward takes inputs=, adapter_name=, task=.")
        return self._forward_batch(group, self._prepare(group, inputs), task, training)

    def _forward_batch(self, group: OptimizerGroup, batch: dict[str, Any], task: str, training: bool) -> Any:
        if self.sizes.pp > 1:
            raise MegatronConfigError("With pp_size > 1 the model is split over pipeline stages: use "
                                      "forward_backward (megatron's schedule) instead of forward/forward_only.")
        self.model.train(training)
        self._activate(group)
        with self.precision.autocast():
            outputs = self._run(self.model, batch)
        group.last_task = task
        group.record_forward(batch, outputs, count_tokens(batch), training)
        return outputs

    def _compute_loss(self, group: OptimizerGroup, inputs: Any, outputs: Any,
                      kwargs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        if outputs is None:
            raise RuntimeError(f"calculate_loss(adapter_name={group.name!r}) needs a forward first "
                               "(forward(inputs=...) or forward_only(inputs=...)).")
        loss_fn = group.loss if group.loss is not None else CrossEntropyLoss()
        if isinstance(loss_fn, Loss):
            total, items = loss_fn.compute(inputs, outputs, **kwargs)
        else:  # a plain callable returns a per-batch mean: every micro-batch weighs the same
            total, items = loss_fn(inputs, outputs, **kwargs), 1
        if not isinstance(total, torch.Tensor) or total.numel() != 1:
            raise TypeError(f"The loss {type(loss_fn).__name__} returned {type(total).__name__}; "
                            "a loss must return a scalar tensor.")
        return total.reshape(()), items

    def _pad_token_id(self, group: OptimizerGroup) -> int:
        if group.template is not None and isinstance(getattr(group.template, "pad_token_id", None), int):
            return group.template.pad_token_id
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(self.hf_config, name, None)
            if isinstance(value, int):
                return value
        return 0


def _check_task(task: str) -> None:
    if task != "causal_lm":
        raise MegatronConfigError(f"task={task!r}: MegatronModel runs 'causal_lm' only (GPTModel has no "
                                  "embedding-pooling head); use TransformersModel for task='embedding'.")


def _mean(total: torch.Tensor, items: Any) -> float:
    return float(total.detach()) / max(float(items), 1.0)
