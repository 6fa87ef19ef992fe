"""forward_backward through megatron-core's forward-backward schedule (CUDA).

The batch is split by rows into ``num_microbatches``; ``get_forward_backward_func()`` picks the
no-pipelining or the 1F1B pipelined schedule from the parallel state. The twinkle loss runs on
the last pipeline stage and returns ``(loss sum, token count, report)``: with
``calculate_per_token_loss`` megatron back-propagates the sum, and the accumulation boundary
divides by all tokens of the window (``drivers.finalize``). Gradient synchronisation is deferred
to that boundary (``finalize_model_grads``), so several forward_backward calls accumulate.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from twinkle import collective
from twinkle.model.inputs import to_device
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.utils.lazy_float import LazyFloat
from twinkle_megatron.errors import MegatronConfigError


def split_rows(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """``parts`` micro-batches of consecutive rows (every tensor with the batch's row count is split)."""
    rows = batch["input_ids"].shape[0]
    if parts < 1 or rows % parts:
        raise MegatronConfigError(f"num_microbatches={parts} must divide the batch's {rows} rows.")
    size = rows // parts
    out = []
    for i in range(parts):
        out.append({k: v[i * size:(i + 1) * size] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rows
                    else v for k, v in batch.items()})
    return out


def _loss_func(model: Any, group: OptimizerGroup, batch: dict[str, Any], output: torch.Tensor) -> tuple:
    outputs = model._logits_outputs(output)
    model._record_forward(group, batch, outputs, True)  # before the loss: megatron's kernel reuses the logits
    total, items = model._compute_loss(group, batch, outputs, {}, consume=True)
    items_t = torch.as_tensor(items, device=total.device).reshape(()).to(torch.int64)
    group.record_loss(total.detach(), items_t, True)
    report = torch.stack([total.detach().float(), items_t.float()])
    return total, items_t, {"loss": report}


def _forward_step(model: Any, group: OptimizerGroup, data_iterator: Any, module: torch.nn.Module) -> tuple:
    batch = to_device(next(data_iterator), model.device)
    return model._run(module, batch), partial(_loss_func, model, group, batch)


def _pipeline_sum(values: torch.Tensor) -> torch.Tensor:
    """Loss sum and token count live on the last stage; give every pipeline stage the same numbers."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() > 1:
        collective.broadcast_(values, src=ps.get_pipeline_model_parallel_last_rank(),
                              group=ps.get_pipeline_model_parallel_group())
    return values


def schedule_forward_backward(model: Any, group: OptimizerGroup, inputs: Any, num_microbatches: int,
                              kwargs: dict[str, Any]) -> LazyFloat:
    """Run the schedule over ``inputs``; returns the per-token mean loss (the same on every rank, read lazily)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if kwargs:
        raise TypeError(f"forward_backward got unexpected arguments {sorted(kwargs)}; it takes inputs=, "
                        "adapter_name=, num_microbatches=, gradient_accumulation_steps=.")
    batch = model._model_batch(group, model._prepare(group, inputs))
    micro = split_rows(batch, num_microbatches)
    module = model._module_for(group)
    module.train(True)
    model._activate(group)
    model.transformer_config.grad_scale_func = getattr(group.optimizer, "scale_loss", None)  # this group's scaler
    results = get_forward_backward_func()(
        forward_step_func=partial(_forward_step, model, group), data_iterator=iter(micro), model=[module],
        num_microbatches=num_microbatches, seq_length=batch["input_ids"].shape[1],
        micro_batch_size=micro[0]["input_ids"].shape[0], forward_only=False,
    )
    sums = torch.zeros(2, device=model.device)
    for report in results:
        sums += report["loss"].to(sums.device)
    sums = _pipeline_sum(sums)
    if model.sizes.cp > 1:  # each CP rank summed its own tokens
        from megatron.core import parallel_state as ps

        sums = collective.all_reduce(sums, group=ps.get_context_parallel_group())
    group.last_task = "causal_lm"
    group.last_loss = sums[0]  # record_backward keeps its finiteness for the skipped-step check
    group.record_backward(sums[1].to(torch.int64))
    group.last_outputs = None
    group.last_loss = None
    return LazyFloat(sums[0], sums[1])
