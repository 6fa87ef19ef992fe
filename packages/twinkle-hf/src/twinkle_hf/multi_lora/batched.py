"""forward_backward_multi: one forward/backward over rows of several tenants (grouped-adapter batch).

The tenants' batches are stacked (right-padded to the longest row) into one batch; row range ``t``
runs through tenant ``t``'s LoRA only (``slots.Route``), as in mLoRA's BatchLoRA. Each tenant's
loss is computed by its own loss function on its own rows and divided by its own accumulation
divisor; the sum is back-propagated once. Rows never interact in a transformer forward and the
tenants' parameters are disjoint, so every tenant receives exactly the gradient of its own loss
-- the same as its own ``forward_backward`` (up to float reordering of the wider padded matmuls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from twinkle.loss import CrossEntropyLoss, Loss, TokenOutputs
from twinkle.loss.token_inputs import needs_reference
from twinkle.processor.input_processor import TOKEN_FIELDS
from twinkle_hf.model.inputs import collate, count_tokens, to_device
from twinkle_hf.model.tasks import run_task
from twinkle_hf.multi_lora.slots import Route

#: Keys stacked across tenants, with their padding value (RL rows add their per-token fields, padded with 0).
_PAD = {"input_ids": None, "attention_mask": 0, "labels": -100, "position_ids": 0,
        **{key: 0 for key in TOKEN_FIELDS}}


class BatchedMixin:
    """The fused multi-tenant training step of MultiLoraTransformersModel."""

    def forward_backward_multi(self, inputs: Mapping[str, Any], *, task: str = "causal_lm") -> dict[str, float]:
        """One forward + backward for ``{tenant: batch}``; returns each tenant's per-token mean loss.

        Equivalent to ``forward_backward(inputs=batch, adapter_name=tenant)`` for every tenant (each
        group's accumulation, metrics and loss are updated the same way), in one pass.
        """
        if task != "causal_lm":
            raise ValueError(f"forward_backward_multi supports task='causal_lm' only, got {task!r}; use "
                             "forward_backward per tenant for other tasks.")
        if not isinstance(inputs, Mapping) or not inputs:
            raise TypeError("forward_backward_multi takes a non-empty dict {tenant: batch}.")
        with self.multi_lora.lock:
            groups = {t: self._group(t) for t in inputs}
            if len({g.name for g in groups.values()}) != len(groups):
                raise ValueError(f"{list(inputs)} name the same tenant twice (tenant and slot names); give each "
                                 "tenant once.")
            batches = {t: to_device(collate(b, groups[t], self._pad_token_id(groups[t])), self.device)
                       for t, b in inputs.items()}
            merged, ranges = _stack(batches, {t: self._pad_token_id(g) for t, g in groups.items()})
            self._check_length(merged)
            if any(needs_reference(groups[t].loss, batches[t]) for t in inputs):  # one base forward serves all
                merged["ref_logprobs"] = self._reference_logprobs(next(iter(groups.values())), merged)
            routes = [Route(self.slots.specs[groups[t].name], start, stop) for t, (start, stop) in ranges.items()]
            if not self.model.training:
                self.model.train(True)
            with self.slots.route(routes):
                outputs = self._multi_forward(merged)
                losses = {}
                for t, (start, stop) in ranges.items():  # compute everything before touching any group
                    sub_inputs = {k: v[start:stop] for k, v in merged.items()}
                    sub_outputs = CausalLMOutputWithPast(logits=outputs.logits[start:stop])
                    loss, items = _loss(groups[t], sub_inputs, sub_outputs)
                    kept_outputs = getattr(groups[t].loss, "last_outputs", None)
                    self._loss_outputs()[groups[t].name] = kept_outputs if isinstance(kept_outputs, TokenOutputs) \
                        else None
                    value, count = self._global_items(loss, items)
                    losses[t] = (sub_inputs, sub_outputs, loss, items, value, count)
                total, kept = None, {}
                for t, (sub_inputs, sub_outputs, loss, items, value, count) in losses.items():
                    group = groups[t]
                    group.record_forward(sub_inputs, sub_outputs, count_tokens(sub_inputs), True)
                    group.last_task = task
                    group.record_loss(loss, items, True)
                    group.last_outputs = None
                    scaled = loss * self._average_factor() / group.backward_divisor(count)
                    if group.scaler is not None:
                        scaled = group.scaler.scale(scaled)
                    total = scaled if total is None else total + scaled
                    kept[t] = (value, count)
                del outputs, losses, sub_outputs  # metrics have seen the logits: free them before backward's peak
                total.backward()
            result = {}
            for t, (value, count) in kept.items():
                groups[t].record_backward(count)
                groups[t].last_loss = None
                result[t] = float(value) / max(float(count), 1.0)
            return result

    # ------------------------------------------- distributed hooks of TransformersModel (no-ops alone)
    def _distributed(self) -> bool:
        plan = getattr(self, "dist_plan", None)
        return bool(plan is not None and plan.distributed)

    def _multi_forward(self, merged: dict[str, Any]) -> Any:
        """Wrap on first use, sync gradients on this backward (linear: early syncs stay exact), run."""
        ensure = getattr(self, "_ensure_wrapped", None)
        if ensure is not None:
            ensure()
        if self._distributed():
            if getattr(self, "_ddp", None) is not None:
                self._ddp.require_backward_grad_sync = True
            else:
                self.model.set_requires_gradient_sync(True)
        run = getattr(self, "_run_forward", None)
        with self.precision.autocast():
            if run is not None:
                return run("causal_lm", merged, None)
            return run_task(self.model, self._hf_model(), "causal_lm", merged)

    def _global_items(self, loss: torch.Tensor, items: Any) -> tuple[Any, Any]:
        """(loss sum, items) over every data rank; this rank's own on one process."""
        if self._distributed():
            return self._global_loss_items(loss, items)
        return loss.detach(), items

    def _average_factor(self) -> int:
        return self._grad_average_factor if self._distributed() else 1


def _loss(group: Any, inputs: dict[str, Any], outputs: Any) -> tuple[torch.Tensor, Any]:
    loss_fn = group.loss if group.loss is not None else CrossEntropyLoss()
    if isinstance(loss_fn, Loss):
        total, items = loss_fn.compute(inputs, outputs)
    else:
        total, items = loss_fn(inputs, outputs), 1
    if not isinstance(total, torch.Tensor) or total.numel() != 1:
        raise TypeError(f"The loss {type(loss_fn).__name__} of group {group.name!r} returned "
                        f"{type(total).__name__}; a loss must return a scalar tensor.")
    return total.reshape(()), items


def _stack(batches: dict[str, dict[str, Any]], pad_ids: dict[str, int]) -> tuple[dict[str, Any], dict[str, tuple]]:
    """Right-pad every tenant's rows to one width and stack them; returns the row range of each tenant."""
    for t, batch in batches.items():
        extra = sorted(set(batch) - set(_PAD))
        if "position_ids" in batch and "attention_mask" not in batch:
            raise ValueError(f"Tenant {t!r}'s batch is packed (position_ids without attention_mask); "
                             "forward_backward_multi stacks padded rows: collate without padding_free.")
        if extra or "input_ids" not in batch:
            raise ValueError(f"Tenant {t!r}'s batch has keys {sorted(batch)}; forward_backward_multi stacks "
                             f"{', '.join(_PAD)} only (input_ids required).")
    width = max(b["input_ids"].shape[1] for b in batches.values())
    merged: dict[str, list[torch.Tensor]] = {}
    ranges, start = {}, 0
    for t, batch in batches.items():
        rows = batch["input_ids"].shape[0]
        batch = dict(batch)
        batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))
        for key, fill in _PAD.items():
            if key in batch:
                value = pad_ids[t] if fill is None else fill
                tensor = batch[key]
                merged.setdefault(key, []).append(
                    torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value))
        ranges[t] = (start, start + rows)
        start += rows
    if len({len(v) for v in merged.values()}) != 1:
        raise ValueError("Every tenant's batch needs the same keys (e.g. all with labels).")
    return {k: torch.cat(v) for k, v in merged.items()}, ranges
