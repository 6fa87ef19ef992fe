"""The training step, written once for every backend.

Computing: ``forward`` -> loss -> backward for one or many routes (a single adapter is one route; a
batched multi-tenant step is several routes over row ranges of one stacked batch). Each route's
loss is its group's, divided by the group's accumulation divisor (or kept as a sum, see
``Backend.sums_losses``), fp16-scaled, and the routes' losses are back-propagated once.

Updating: ``clip_grad_norm`` / ``step`` / ``zero_grad`` / ``lr_step`` act on an accumulation
boundary only. Before the optimizer runs, an inf/NaN loss of the window or gradient norm skips the
step, on every rank together (``Backend.agree``); the backend's ``apply_step`` may refuse too (an
fp16 overflow). A skipped step changes no weight, optimizer state, ``cur_step`` or lr.

The backend (:class:`twinkle.engine.backend.Backend`) runs a task on a batch and applies what is
decided here; nothing of this sequence lives in a backend.

Losses are returned as :class:`LazyFloat`: converting a loss to a Python float right away would make
the host wait for the device after every micro-batch, which stalls the queue of GPU work; a
LazyFloat keeps the device tensors and converts once, on first use (``float(x)``, arithmetic,
comparison, formatting). Pickling gives a plain ``float``, so results sent through Ray or
``torch.save`` are ordinary numbers. ``json.dumps`` needs ``float(x)``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from twinkle.loss.base import Loss
from twinkle.loss.token_inputs import TokenOutputs
from twinkle.model.inputs import count_tokens

if TYPE_CHECKING:
    from twinkle.engine.backend import Backend
    from twinkle.model.optimizer_group import OptimizerGroup


@dataclass(frozen=True)
class Route:
    """Rows ``rows`` of the batch (``None``: every row) run through ``group``'s parameters."""

    group: OptimizerGroup
    rows: slice | None = None


class Engine:
    """forward / loss / backward / step for the groups of one model, over its backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        #: per group: what its last loss computed per token (RL/preference losses), for ``get_loss_outputs``
        self.loss_outputs: dict[str, TokenOutputs | None] = {}

    # ================================================================ computing
    def forward(self, routes: Sequence[Route], batch: Mapping[str, Any], task: str, training: bool,
                options: Mapping[str, Any]) -> Any:
        """One forward of ``batch``; each route's group keeps its rows' inputs and outputs for the loss."""
        backend = self.backend
        for route in routes:  # release the previous logits before allocating new ones
            route.group.last_outputs = route.group.last_loss = None
        batch = self._with_reference(routes, batch, task)
        if training:
            backend.grad_sync(self._closes_window(routes))
        with backend.routed(routes):
            outputs = backend.run(task, batch, training, options)
        for route in routes:
            inputs, outs = _rows(batch, outputs, route.rows)
            route.group.last_task = task
            route.group.record_forward(inputs, outs, count_tokens(inputs), training)
        return outputs

    def calculate_loss(self, group: OptimizerGroup, kwargs: Mapping[str, Any]) -> LazyFloat:
        """The group's loss on its last forward (kwargs go to the loss); kept for :meth:`backward`."""
        total, items = self._loss(group, group.last_inputs, group.last_outputs, kwargs, consumable=False)
        if not group.last_is_training:
            group.last_outputs = None  # an evaluation loss has no backward: free the logits now
        return LazyFloat(*self.backend.data_sum(total, items))

    def backward(self, group: OptimizerGroup) -> None:
        """Back-propagate the group's last calculated loss into its accumulating gradients."""
        loss = group.last_loss
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise RuntimeError(f"backward(adapter_name={group.name!r}) needs a loss with a graph: call forward(...) "
                               "then calculate_loss() first (forward_only runs without gradients).")
        items = group.last_loss_items
        count = items if self.backend.sums_losses else self.backend.data_sum(loss, items)[1]
        with self.backend.routed([Route(group)]):  # gradient-checkpointing recomputes run through the route
            self._scaled(group, loss, count).backward()
        group.record_backward(items if self.backend.sums_losses else count, _finite(loss))
        group.last_loss = group.last_outputs = None

    def forward_backward(self, routes: Sequence[Route], pieces: Sequence[Mapping[str, Any]], task: str,
                         options: Mapping[str, Any]) -> dict[str, LazyFloat]:
        """forward + loss + backward of every piece (rows run in sequence); per group its per-item mean loss.

        Each group's accumulation, metrics and loss outputs are updated as by separate calls, in one pass.
        """
        backend = self.backend
        if backend.schedules and len(routes) == 1:  # several routes (tenants' rows) run eagerly
            return self._scheduled(routes, pieces, task)
        for route in routes:
            route.group.last_outputs = route.group.last_loss = None
        backend.grad_sync(self._closes_window(routes))
        sums: dict[str, list[Any]] = {}  # group name -> [value, count, recorded items, finite]
        with backend.routed(routes):  # gradient-checkpointing recomputes in backward run through the routes too
            for batch in pieces:
                batch = self._with_reference(routes, batch, task)
                outputs = backend.run(task, batch, True, options)
                total = None
                for route in routes:
                    group = route.group
                    inputs, outs = _rows(batch, outputs, route.rows)
                    group.last_task = task
                    group.record_forward(inputs, outs, count_tokens(inputs), True)
                    loss, items = self._loss(group, inputs, outs, {}, consumable=True)
                    group.last_outputs = None  # metrics have seen the logits: free them before backward's peak
                    value, count = backend.data_sum(loss, items)
                    scaled = self._scaled(group, loss, count)
                    total = scaled if total is None else total + scaled
                    _accumulate(sums, group.name, value, count, items if backend.sums_losses else count, _finite(loss))
                del outputs, outs
                total.backward()
        return self._close_call(routes, sums)

    def _scheduled(self, routes: Sequence[Route], pieces: Sequence[Mapping[str, Any]], task: str) -> dict:
        """forward_backward through the backend's own schedule; the loss of each piece is computed here."""
        (route,) = routes
        group = route.group

        def loss_step(batch: Mapping[str, Any], outputs: Any) -> tuple[torch.Tensor, Any]:
            group.last_task = task
            group.record_forward(batch, outputs, count_tokens(batch), True)
            return self._loss(group, batch, outputs, {}, consumable=True)

        self.backend.grad_sync(True)
        value, count, own_items = self.backend.run_schedule(routes, list(pieces), loss_step)
        sums = {group.name: [value, count, own_items, _finite(value)]}
        return self._close_call(routes, sums)

    def _close_call(self, routes: Sequence[Route], sums: dict[str, list[Any]]) -> dict[str, LazyFloat]:
        result = {}
        for route in routes:
            group = route.group
            value, count, recorded, finite = sums[group.name]
            group.record_backward(recorded, finite)
            group.last_loss = group.last_outputs = None
            result[group.name] = LazyFloat(value, count)
        return result

    # ------------------------------------------------------------- internals
    def _loss(self, group: OptimizerGroup, inputs: Mapping[str, Any], outputs: Any, kwargs: Mapping[str, Any],
              consumable: bool) -> tuple[torch.Tensor, Any]:
        """``(loss sum as a 0-dim tensor, items)`` of the group's loss, recorded for metrics and backward.

        A twinkle :class:`Loss` gives its sum and item count; a plain callable returns a per-batch
        mean, so every micro-batch weighs the same (items = 1). A loss that counts correct tokens
        itself (the fused CE path never materialises logits) feeds the group's accuracy metrics.
        """
        if outputs is None:
            raise RuntimeError(f"calculate_loss(adapter_name={group.name!r}) needs a forward first "
                               "(forward(inputs=...) or forward_only(inputs=...)).")
        loss_fn = self.backend.loss_for(group, group.last_task, consumable)
        if isinstance(loss_fn, Loss):
            total, items = loss_fn.compute(inputs, outputs, **kwargs)
        else:
            total, items = loss_fn(inputs, outputs, **kwargs), 1
            if isinstance(total, Mapping) and "loss" in total:  # upstream's LossOutput: the batch's loss
                total = total["loss"]
        if not isinstance(total, torch.Tensor) or total.numel() != 1:
            raise TypeError(f"The loss {type(loss_fn).__name__} of group {group.name!r} returned "
                            f"{type(total).__name__}; a loss must return a scalar tensor.")
        counts = getattr(loss_fn, "last_token_counts", None)
        if counts is not None:
            for metric in group.metrics(group.last_is_training):
                if hasattr(metric, "update_counts"):
                    metric.update_counts(*counts)
        total = total.reshape(())
        group.record_loss(total, items, group.last_is_training)
        kept = getattr(loss_fn, "last_outputs", None)  # the default losses keep none
        self.loss_outputs[group.name] = kept if isinstance(kept, TokenOutputs) else None
        return total, items

    def _scaled(self, group: OptimizerGroup, loss: torch.Tensor, count: Any) -> torch.Tensor:
        """The loss as back-propagated: a sum, or divided by the window's divisor; then fp16-scaled."""
        backend = self.backend
        if not backend.sums_losses:
            multiplier = backend.grad_multiplier
            divisor = group.backward_divisor(count)
            loss = loss * multiplier / divisor if multiplier is not None else loss / divisor
        return backend.scale_loss(group, loss)

    def _with_reference(self, routes: Sequence[Route], batch: Mapping[str, Any], task: str) -> Mapping[str, Any]:
        """The batch with ``ref_logprobs`` of the reference policy when a route's loss needs them."""
        if task == "causal_lm" and "ref_logprobs" not in batch and any(
                getattr(r.group.loss, "needs_reference", False) for r in routes):
            return {**batch, "ref_logprobs": self.backend.reference_logprobs(routes, batch)}
        return batch

    @staticmethod
    def _closes_window(routes: Sequence[Route]) -> bool:
        """Gradients are communicated on the backward that closes the window (always with several routes:
        the reduction is linear, so an early sync stays exact)."""
        if len(routes) != 1:
            return True
        group = routes[0].group
        return group.micro_step + 1 >= group.gradient_accumulation_steps

    # ================================================================= updating
    def clip_grad_norm(self, group: OptimizerGroup, max_grad_norm: float, norm_type: float) -> float | None:
        """Clip on a boundary; the total norm before clipping (None between boundaries)."""
        if not group.is_boundary:
            return None
        self._finish(group)
        group.grad_norm = group.window_grad_norm = self.backend.clip(group, max_grad_norm, norm_type)
        return group.grad_norm

    def step(self, group: OptimizerGroup) -> None:
        """Apply the optimizer on a boundary, unless the loss or gradients are inf/NaN (the step is then skipped)."""
        if not group.is_boundary:
            return
        self._finish(group)
        reason = self._nonfinite_reason(group)
        if reason is None:
            if self.backend.apply_step(group):
                group.finish_step()
                return
            reason = "the optimizer skipped it (inf/NaN gradients: fp16 loss-scale overflow)"
        else:
            self.backend.skip_update(group)
        group.skip_step(reason)

    def zero_grad(self, group: OptimizerGroup) -> None:
        """Clear the group's gradients right after a step (or on a boundary, dropping them)."""
        if not group.zero_grad_due:
            return
        if group.optimizer is not None:
            group.optimizer.zero_grad(set_to_none=True)
        else:
            for param in self.backend.parameters(group):
                param.grad = None
        group.finish_zero_grad()

    def lr_step(self, group: OptimizerGroup) -> None:
        """Advance the group's lr scheduler once per optimizer step."""
        if not group.lr_step_pending:
            return
        if group.lr_scheduler is not None:
            group.lr_scheduler.step()
        group.lr_step_pending = False

    def clip_grad_and_step(self, group: OptimizerGroup, max_grad_norm: float | None, norm_type: float) -> None:
        """clip + step + zero_grad + lr_step on a boundary; ``max_grad_norm=None`` (or <= 0) skips clipping."""
        if not group.is_boundary:
            return
        if max_grad_norm is not None and max_grad_norm > 0:
            self.clip_grad_norm(group, max_grad_norm, norm_type)
        self.step(group)
        self.zero_grad(group)
        self.lr_step(group)

    def _finish(self, group: OptimizerGroup) -> None:
        if group.optimizer is None:
            raise RuntimeError(f"Group {group.name!r} has no optimizer: call set_optimizer(..., "
                               f"adapter_name={group.name!r}) before stepping.")
        if not group.grads_ready:
            self.backend.finish_grads(group)
            group.grads_ready = True

    def _nonfinite_reason(self, group: OptimizerGroup) -> str | None:
        """Why this window must not be applied (an inf/NaN loss or gradient norm), agreed by all ranks; else None.

        One small all-reduce and one host sync per optimizer step.
        """
        norm = group.window_grad_norm
        norm_bad = norm is not None and not math.isfinite(norm)
        finite = group.window_finite
        loss_bad = (~finite).to(torch.float32).reshape(()) if isinstance(finite, torch.Tensor) else torch.zeros(())
        flags = torch.stack([loss_bad, torch.tensor(float(norm_bad), device=loss_bad.device)])
        agreed = self.backend.agree(flags).tolist()
        if not max(agreed):
            return None
        if agreed[0]:
            return "the loss is inf/NaN" + ("" if float(loss_bad) else " on another rank")
        return f"the gradient norm is {norm if norm_bad else 'inf/NaN on another rank'}"


def _rows(batch: Mapping[str, Any], outputs: Any, rows: slice | None) -> tuple[Mapping[str, Any], Any]:
    """A route's share of the batch and of the outputs (everything for a route over all rows)."""
    if rows is None:
        return batch, outputs
    count = batch["input_ids"].shape[0]
    inputs = {k: v[rows] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == count else v
              for k, v in batch.items()}
    select = getattr(outputs, "select_rows", None)
    if select is not None:
        return inputs, select(rows)
    return inputs, {k: v[rows] for k, v in outputs.items() if isinstance(v, torch.Tensor) and v.shape[0] == count}


def _finite(loss: Any) -> Any:
    """A device flag: the loss is finite (True for a plain number)."""
    return loss.detach().isfinite().all() if isinstance(loss, torch.Tensor) else True


def _accumulate(sums: dict[str, list[Any]], name: str, value: Any, count: Any, recorded: Any, finite: Any) -> None:
    """Add one piece's numbers to the group's running sums (the first piece is kept as is: same bits)."""
    if name not in sums:
        sums[name] = [value, count, recorded, finite]
        return
    entry = sums[name]
    entry[0], entry[1], entry[2] = entry[0] + value, entry[1] + count, entry[2] + recorded
    entry[3] = entry[3] & finite if isinstance(entry[3], torch.Tensor) else finite


# ===================================================================== LazyFloat
def _number(value: Any) -> float:
    if hasattr(value, "detach"):
        value = value.detach()
    return float(value)


class LazyFloat:
    """``numerator / max(denominator, 1)`` of numbers or one-element tensors, computed on first use."""

    __slots__ = ("_parts", "_value")

    def __init__(self, numerator: Any, denominator: Any = 1) -> None:
        self._parts: tuple[Any, Any] | None = (numerator, denominator)
        self._value: float | None = None

    def __float__(self) -> float:
        if self._value is None:
            numerator, denominator = self._parts
            self._value = _number(numerator) / max(_number(denominator), 1.0)
            self._parts = None  # release the device tensors
        return self._value

    def item(self) -> float:
        """The value as a Python float (as ``torch.Tensor.item``)."""
        return float(self)

    # ---------------------------------------------------------------- protocols
    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return float, (float(self),)

    def __repr__(self) -> str:
        return repr(float(self))

    def __format__(self, spec: str) -> str:
        return format(float(self), spec)

    def __hash__(self) -> int:
        return hash(float(self))

    def __bool__(self) -> bool:
        return bool(float(self))

    def __int__(self) -> int:
        return int(float(self))

    def __round__(self, ndigits: int | None = None) -> Any:
        return round(float(self), ndigits)

    def as_integer_ratio(self) -> tuple[int, int]:
        return float(self).as_integer_ratio()

    def is_integer(self) -> bool:
        return float(self).is_integer()

    def __neg__(self) -> float:
        return -float(self)

    def __pos__(self) -> float:
        return float(self)

    def __abs__(self) -> float:
        return abs(float(self))


def _binary(name: str) -> Any:
    op = getattr(float, name)

    def method(self: LazyFloat, other: Any) -> Any:
        if isinstance(other, LazyFloat):
            other = float(other)
        return op(float(self), other)

    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__",
              "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__",
              "__mod__", "__rmod__", "__pow__", "__rpow__"):
    setattr(LazyFloat, _name, _binary(_name))
numbers.Real.register(LazyFloat)
