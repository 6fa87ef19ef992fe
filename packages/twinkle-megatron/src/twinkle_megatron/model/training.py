"""forward / forward_only / calculate_loss / backward / forward_backward of MegatronModel.

The eager path (one forward, twinkle's loss, one backward) runs wherever the whole model is on
this rank (pp_size=1): it is what runs on CPU. On CUDA, ``forward_backward`` goes through
megatron-core's forward-backward schedule (``schedule.py``), which also covers pipeline stages.
Backward always runs on the loss *sum*; the accumulation boundary divides by the window's tokens
(``drivers.py``).

The model returns this rank's vocabulary shard of the logits; the default cross-entropy and the
token accuracy are computed on it (``vocab_parallel.py``). Before the forward a batch gets its
next-token labels and, under context parallelism, is cut to this rank's share of every sequence
(``parallel/context.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle import collective
from twinkle.model.inputs import count_tokens, to_device
from twinkle.model.losses import compute_loss, require_forward
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.utils.checks import check_no_kwargs
from twinkle.utils.lazy_float import LazyFloat
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model import vocab_parallel as vp
from twinkle_megatron.model.inputs import attention_mask, check_plain_causal, collate
from twinkle_megatron.parallel import context


class TrainingMixin:
    """The computing half of the TwinkleModel API (``inputs`` positionally or as ``inputs=``, as in the HF backend)."""

    def forward(self, inputs: Any, *, adapter_name: str | None = None, task: str = "causal_lm", **kwargs: Any) -> Any:
        """Training-mode forward; returns ``{'logits': (batch, seq, vocab)}`` kept for calculate_loss."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        return self._forward(group, inputs, task, True, kwargs)

    def forward_only(self, inputs: Any, *, adapter_name: str | None = None, task: str = "causal_lm",
                     **kwargs: Any) -> Any:
        """Eval-mode forward without gradients, counted by evaluation metrics."""
        group = self._group(adapter_name)
        with torch.no_grad():
            return self._forward(group, inputs, task, False, kwargs)

    def calculate_loss(self, *, adapter_name: str | None = None, **kwargs: Any) -> LazyFloat:
        """The group's loss on the last forward (per-item mean, read lazily); kwargs go to the loss."""
        group = self._group(adapter_name)
        total, items = self._compute_loss(group, group.last_inputs, group.last_outputs, kwargs, consume=False)
        group.record_loss(total, items, group.last_is_training)
        return self._sequence_mean(total, items)

    def backward(self, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Back-propagate the last loss sum into the group's accumulating gradients."""
        group = self._group(adapter_name)
        group.take_accumulation_steps(kwargs)
        check_no_kwargs("backward", kwargs)
        loss = group.last_loss
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise RuntimeError(f"backward(adapter_name={group.name!r}) needs a loss with a graph: call forward(...) "
                               "then calculate_loss() first (forward_only runs without gradients).")
        scale = getattr(group.optimizer, "loss_scale", None)
        (loss * scale() if scale is not None else loss).backward()
        group.record_backward(group.last_loss_items)
        group.last_loss = None
        group.last_outputs = None

    def forward_backward(self, inputs: Any, *, adapter_name: str | None = None, task: str = "causal_lm",
                         **kwargs: Any) -> LazyFloat:
        """forward + loss + backward; returns the per-token mean loss of ``inputs`` (read lazily).

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
        check_no_kwargs("forward_backward", kwargs)
        from twinkle_megatron.model.schedule import split_rows

        loss_sum, items_sum = 0.0, 0
        for batch in split_rows(self._model_batch(group, self._prepare(group, inputs)), micro):
            outputs = self._forward_batch(group, batch, task, True)
            total, items = self._compute_loss(group, batch, outputs, {}, consume=True)
            group.record_loss(total.detach(), items, True)
            total.backward()
            loss_sum, items_sum = loss_sum + total.detach(), items_sum + items
        group.record_backward(items_sum)
        group.last_loss, group.last_outputs = None, None
        return self._sequence_mean(loss_sum, items_sum)

    # -------------------------------------------------------------- internals
    def _prepare(self, group: OptimizerGroup, inputs: Any) -> dict[str, Any]:
        batch = collate(inputs, group, self._pad_token_id(group), self.vocab_size)
        if self.use_te:  # on the whole rows, still on the host: no wait for the device per micro-batch
            check_plain_causal(batch)
        return to_device(batch, self.device)

    def _model_batch(self, group: OptimizerGroup, batch: dict[str, Any]) -> dict[str, Any]:
        """Next-token labels on the whole rows, then (cp > 1) this rank's share of every sequence."""
        if isinstance(batch.get("labels"), torch.Tensor):
            batch = {**batch, vp.NEXT_LABELS: vp.next_token_labels(batch["labels"], vp.ignore_index_of(group.loss))}
        sizes = self.sizes
        multiple = context.sequence_multiple(sizes.cp, sizes.tp, sizes.sequence_parallel)
        if multiple > 1:
            batch = context.pad_sequence(batch, multiple, self._pad_token_id(group))
        return context.split_for_rank(batch, sizes.cp, self.ranks.cp)

    def _sequence_mean(self, total: Any, items: Any) -> LazyFloat:
        """Per-token mean of a loss sum, read lazily; under context parallelism summed over the CP ranks first."""
        total = total.detach() if isinstance(total, torch.Tensor) else total
        if self.sizes.cp > 1:
            from megatron.core import parallel_state as ps

            total, items = collective.sum_values([total, items], group=ps.get_context_parallel_group()).unbind()
        return LazyFloat(total, items)

    def _mask(self, batch: dict[str, Any]) -> torch.Tensor | None:
        if self.use_te:  # causal by construction; _prepare checked the rows
            return None
        return attention_mask(batch, self.args.sliding_window)

    def _run(self, module: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """GPTModel's forward: on the last stage this rank's vocabulary shard of the logits (never gathered)."""
        return module(batch["input_ids"], None, self._mask(batch), runtime_gather_output=False)

    def _logits_outputs(self, shard: torch.Tensor) -> vp.LogitsOutputs:
        return vp.LogitsOutputs(vp.mask_vocab_padding(shard, self.vocab_size), self.vocab_size, self.sizes.cp)

    def _record_forward(self, group: OptimizerGroup, batch: dict[str, Any], outputs: vp.LogitsOutputs,
                        training: bool) -> None:
        """Metrics see no full logits: token accuracy gets counts from the vocab-parallel arg-max."""
        group.record_forward(batch, {"vocab_parallel_logits": outputs.vocab_parallel_logits}, count_tokens(batch),
                             training)
        group.last_outputs = outputs
        if vp.NEXT_LABELS in batch:
            counts = vp.argmax_matches(outputs.vocab_parallel_logits, batch[vp.NEXT_LABELS],
                                       vp.ignore_index_of(group.loss))
            vp.feed_token_counts(group.metrics(training), *counts)

    def _forward(self, group: OptimizerGroup, inputs: Any, task: str, training: bool, kwargs: dict[str, Any]) -> Any:
        _check_task(task)
        if kwargs:
            raise TypeError(f"Unknown forward options {sorted(kwargs)}; forward takes inputs=, adapter_name=, task=.")
        return self._forward_batch(group, self._model_batch(group, self._prepare(group, inputs)), task, training)

    def _forward_batch(self, group: OptimizerGroup, batch: dict[str, Any], task: str, training: bool) -> Any:
        if self.sizes.pp > 1:
            raise MegatronConfigError("With pp_size > 1 the model is split over pipeline stages: use "
                                      "forward_backward (megatron's schedule) instead of forward/forward_only.")
        module = self._module_for(group)
        module.train(training)
        self._activate(group)
        with self.precision.autocast():
            outputs = self._logits_outputs(self._run(module, batch))
        group.last_task = task
        self._record_forward(group, batch, outputs, training)
        return outputs

    def _compute_loss(self, group: OptimizerGroup, inputs: Any, outputs: Any, kwargs: dict[str, Any],
                      consume: bool) -> tuple[torch.Tensor, Any]:
        """(loss sum, items) of this rank's tokens; ``consume`` lets the vocab-parallel kernel reuse the logits."""
        require_forward(group, outputs)
        loss_fn = group.loss
        if vp.is_default_cross_entropy(loss_fn):  # its compute() takes no options
            if vp.NEXT_LABELS not in inputs:
                raise KeyError("CrossEntropyLoss needs 'labels' in the inputs (encode the dataset with a template).")
            total, items = vp.cross_entropy_sum(outputs.vocab_parallel_logits, inputs[vp.NEXT_LABELS],
                                                vp.ignore_index_of(loss_fn), consume)
            return total.reshape(()), items
        if self.sizes.cp > 1:
            raise MegatronConfigError(
                f"With cp_size={self.sizes.cp} the loss is computed on each rank's part of the sequence; only the "
                f"default CrossEntropyLoss does that (got {type(loss_fn).__name__}). Use set_loss('CrossEntropyLoss') "
                "or cp_size=1.")
        return compute_loss(group, inputs, outputs, kwargs, group.last_is_training)

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
