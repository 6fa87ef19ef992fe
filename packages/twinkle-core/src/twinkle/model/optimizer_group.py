"""OptimizerGroup: the training state of one adapter (or of the full model), backend-neutral.

Every TwinkleModel keeps ``optimizer_group: dict[str, OptimizerGroup]``. A group owns its
optimizer, lr scheduler, loss, metrics, template, processor and scaler, and the bookkeeping of
gradient accumulation, which lives here so every backend gets the same semantics:

* ``backward`` divides each micro-batch's loss *sum* by the item (token) count of the window's
  first micro-batch (:meth:`backward_divisor`), keeping gradient magnitudes at the usual
  per-token-mean scale (fp16 friendly);
* on the boundary the gradients are multiplied by :meth:`grad_rescale`
  (``first items / all items of the window``), so the applied gradient is exactly that of the
  window's micro-batches taken as one token-weighted batch. With one micro-batch per step the
  factor is 1 and nothing is touched;
* ``clip_grad_norm`` / ``step`` act only on a boundary, ``zero_grad`` only right after a step (or
  on a boundary), ``lr_step`` once per optimizer step.

A step whose loss or gradient norm is inf/NaN (or that the optimizer itself refused: an fp16
overflow, megatron's optimizer reporting no success) is *skipped*: weights, optimizer state,
``cur_step`` and the lr scheduler stay as they were, the gradients are dropped, the skip is counted
(``skipped_steps`` in the metrics) and warned about. After ``max_consecutive_skips`` skips in a row
training stops with :class:`TooManySkippedStepsError` naming the step.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import TwinkleError
from twinkle.log import get_logger
from twinkle.metric import Metric, default_metrics
from twinkle.utils.checks import check_int

logger = get_logger()

#: Name of the group that trains the whole model (no adapter). It is also peft's default adapter
#: name, so ``add_adapter_to_model('default', ...)`` replaces it naturally.
DEFAULT_GROUP = "default"
#: Skipped steps in a row after which training stops. An fp16 GradScaler starting at 2**16 backs off
#: once per skip, so a few dozen skips at the start are normal; fifty in a row means the run diverged.
DEFAULT_MAX_CONSECUTIVE_SKIPS = 50


class TooManySkippedStepsError(TwinkleError, RuntimeError):
    """Too many optimizer steps in a row had an inf/NaN loss or gradient: the run has diverged."""


def at_least_one(count: Any) -> Any:
    """``max(count, 1)`` for ints and device tensors alike (no host sync for tensors)."""
    return count.clamp(min=1) if hasattr(count, "clamp") else max(int(count), 1)


def check_accumulation_steps(value: Any) -> int:
    """``gradient_accumulation_steps`` must be a positive int; say so clearly otherwise."""
    return check_int(value, "gradient_accumulation_steps")


_ADAPTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def check_adapter_name(name: Any, what: str = "adapter_name") -> str:
    """Adapter and tenant names become directory names and peft keys: letters, digits, '_' and '-' only.

    The whole name must match (``fullmatch``): a trailing newline is refused too.
    """
    if not isinstance(name, str) or not _ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"{what}={name!r} must be a non-empty identifier-like string (letters, digits, '_' or '-'; "
                         "no dots, slashes, spaces or newlines).")
    return name


def check_lr(value: Any, where: str = "lr") -> float:
    """A learning rate must be a finite number >= 0 (NaN or inf would be stepped into every weight)."""
    import math

    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}={value!r}: a learning rate must be a finite number >= 0, e.g. 1e-4.")
    return number


def check_optimizer_lrs(optimizer: Any, where: str = "the optimizer") -> None:
    """Every parameter group's lr of a ready optimizer instance passes :func:`check_lr`."""
    for i, param_group in enumerate(getattr(optimizer, "param_groups", ())):
        if "lr" in param_group:
            lr = param_group["lr"]
            check_lr(lr.item() if hasattr(lr, "item") else lr, f"{where} param_groups[{i}]['lr'], lr")


def check_optimizer_params(optimizer: Any, group_params: Any, group_name: str,
                           owners: Mapping[str, Any] | None = None) -> None:
    """An optimizer instance may only hold parameters its group trains (else one group's step moves another's).

    ``owners``: the other groups' parameter lists, to say whose parameters were given.
    """
    allowed = {id(p) for p in group_params}
    foreign = [p for g in getattr(optimizer, "param_groups", ()) for p in g.get("params", ()) if id(p) not in allowed]
    if not foreign:
        return
    ids = {id(p) for p in foreign}
    whose = sorted(name for name, params in (owners or {}).items()
                   if name != group_name and any(id(p) in ids for p in params))
    hint = f" (they belong to {', '.join(repr(w) for w in whose)})" if whose else ""
    raise ValueError(f"The optimizer instance holds {len(foreign)} parameter{'s' if len(foreign) > 1 else ''} that "
                     f"group {group_name!r} does not train{hint}; a step of {group_name!r} would change them. Build it "
                     f"over this group's parameters only, or pass the optimizer's name/class to set_optimizer.")


def check_max_consecutive_skips(value: Any) -> int:
    """``max_consecutive_skips`` must be a positive int."""
    return check_int(value, "max_consecutive_skips", hint=" (skipped steps in a row before training stops)")


@dataclass
class _Throughput:
    """Tokens seen since the window started, for tokens/s."""

    tokens: Any = 0
    started: float | None = None

    def add(self, tokens: Any) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        self.tokens = self.tokens + tokens

    def rate(self) -> float | None:
        if self.started is None:
            return None
        elapsed = time.perf_counter() - self.started
        return float(self.tokens) / elapsed if elapsed > 0 else None

    def reset(self) -> None:
        self.tokens, self.started = 0, None


@dataclass
class OptimizerGroup:
    """Per-adapter training state; see the module docstring for the accumulation contract."""

    name: str
    is_adapter: bool = False
    optimizer: Any = None
    lr_scheduler: Any = None
    loss: Any = None
    train_metrics: list[Metric] = field(default_factory=default_metrics)
    eval_metrics: list[Metric] = field(default_factory=default_metrics)
    template: Any = None
    processor: Any = None
    scaler: Any = None
    gradient_accumulation_steps: int = 1
    max_consecutive_skips: int = DEFAULT_MAX_CONSECUTIVE_SKIPS
    cur_step: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    micro_step: int = 0
    total_micro_steps: int = 0
    window_items: Any = 0
    window_ref_items: Any = 0
    window_ref_taken: bool = False
    grad_norm: float | None = None
    window_grad_norm: float | None = None
    window_finite: Any = True
    grads_ready: bool = False
    stepped: bool = False
    lr_step_pending: bool = False
    last_inputs: Any = None
    last_outputs: Any = None
    last_loss: Any = None
    last_loss_items: Any = 0
    last_is_training: bool = True
    last_task: str = "causal_lm"
    total_train_tokens: Any = 0
    _train_rate: _Throughput = field(default_factory=_Throughput)
    _eval_rate: _Throughput = field(default_factory=_Throughput)

    def __post_init__(self) -> None:
        check_accumulation_steps(self.gradient_accumulation_steps)
        check_max_consecutive_skips(self.max_consecutive_skips)

    # ------------------------------------------------------------ accumulation
    def take_accumulation_steps(self, kwargs: dict[str, Any]) -> None:
        """Apply a ``gradient_accumulation_steps=`` given to any stepping call (and remove it from kwargs)."""
        self._take_option(kwargs, "gradient_accumulation_steps", check_accumulation_steps)

    def take_skip_limit(self, kwargs: dict[str, Any]) -> None:
        """Apply a ``max_consecutive_skips=`` given to a stepping call (and remove it from kwargs)."""
        self._take_option(kwargs, "max_consecutive_skips", check_max_consecutive_skips)

    def _take_option(self, kwargs: dict[str, Any], name: str, check: Any) -> None:
        value = kwargs.pop(name, None)
        if value is not None:
            setattr(self, name, check(value))

    def backward_divisor(self, num_items: Any) -> Any:
        """What this micro-batch's loss sum is divided by before backward (see module docstring).

        Item counts may be device tensors: nothing here forces a host sync.
        """
        if self.micro_step == 0 and not self.window_ref_taken:  # the window's first backward (of its first piece)
            self.window_ref_items = at_least_one(num_items)
            self.window_ref_taken = True
        return self.window_ref_items

    def record_backward(self, num_items: Any, finite: Any = True) -> None:
        """Count one micro-batch's backward over ``num_items``; ``finite`` (a device flag) says its loss was finite."""
        if finite is not True:
            self.window_finite = finite if self.window_finite is True else self.window_finite & finite
        self.micro_step += 1
        self.total_micro_steps += 1
        self.window_items = self.window_items + num_items
        self.grads_ready = False

    @property
    def is_boundary(self) -> bool:
        """True once the window holds ``gradient_accumulation_steps`` micro-batches."""
        return self.micro_step >= self.gradient_accumulation_steps

    def grad_rescale(self) -> Any:
        """Factor turning the accumulated gradients into the token-weighted mean; None when it is 1.

        With a single micro-batch in the window the factor is exactly 1 and is not computed.
        """
        if self.micro_step <= 1:
            return None
        factor = self.window_ref_items / at_least_one(self.window_items)
        return None if isinstance(factor, float) and factor == 1.0 else factor

    def finish_step(self) -> None:
        """Record an optimizer step: the window closes and zero_grad / lr_step become due."""
        self.cur_step += 1
        self.consecutive_skips = 0
        self.stepped = True
        self.lr_step_pending = True
        self._close_window()

    def skip_step(self, reason: str) -> None:
        """Record a skipped step: no step is counted and the lr scheduler stays; zero_grad drops the gradients.

        Raises :class:`TooManySkippedStepsError` after ``max_consecutive_skips`` skips in a row.
        """
        step = self.cur_step + 1
        self.skipped_steps += 1
        self.consecutive_skips += 1
        self.stepped = True  # zero_grad is due: the bad gradients must not leak into the next window
        self.lr_step_pending = False
        self._close_window()
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise TooManySkippedStepsError(
                f"Training stopped at step {step} of group {self.name!r}: {self.consecutive_skips} optimizer steps "
                f"in a row were skipped (last: {reason}). The loss or the gradients keep being inf/NaN: lower the "
                "learning rate, check the data, prefer bf16 to fp16, or allow more with "
                f"max_consecutive_skips= (now {self.max_consecutive_skips}).")
        logger.warning("Skipped step %d of group %r: %s. Weights, optimizer, lr scheduler and step count are "
                       "unchanged (%d in a row, %d in total; training stops after %d in a row).", step, self.name,
                       reason, self.consecutive_skips, self.skipped_steps, self.max_consecutive_skips)

    @property
    def zero_grad_due(self) -> bool:
        return self.stepped or self.is_boundary

    def finish_zero_grad(self) -> None:
        self.stepped = False
        if self.is_boundary:  # gradients dropped without a step: the window starts over
            self._close_window()

    def _close_window(self) -> None:
        self.micro_step = 0
        self.window_items = 0
        self.window_ref_items = 0
        self.window_ref_taken = False
        self.window_grad_norm = None
        self.window_finite = True
        self.grads_ready = False

    # ----------------------------------------------------------------- metrics
    def metrics(self, is_training: bool) -> list[Metric]:
        return self.train_metrics if is_training else self.eval_metrics

    def record_forward(self, inputs: Mapping[str, Any], outputs: Any, tokens: Any, is_training: bool) -> None:
        """Keep the forward for calculate_loss and feed the metrics and token counters."""
        self.last_inputs, self.last_outputs, self.last_is_training = inputs, outputs, is_training
        for metric in self.metrics(is_training):
            metric.update(inputs, outputs)
        (self._train_rate if is_training else self._eval_rate).add(tokens)
        if is_training:
            self.total_train_tokens = self.total_train_tokens + tokens

    def record_loss(self, loss_sum: Any, num_items: Any, is_training: bool) -> None:
        """Keep the loss (with its graph) for backward and feed the metrics."""
        self.last_loss, self.last_loss_items = loss_sum, num_items
        for metric in self.metrics(is_training):
            metric.update_loss(loss_sum, num_items)

    def compute_metrics(self, is_training: bool, lr: float | None = None) -> dict[str, float]:
        """Every metric's numbers plus this group's (grad_norm, lr, tokens/s, step); then reset."""
        result: dict[str, float] = {}
        for metric in self.metrics(is_training):
            result.update(metric.compute())
            metric.reset()
        rate = self._train_rate if is_training else self._eval_rate
        tokens_per_second = rate.rate()
        if tokens_per_second is not None:
            result["tokens_per_second"] = tokens_per_second
        rate.reset()
        if is_training:
            if self.grad_norm is not None:
                result["grad_norm"] = float(self.grad_norm)
            if lr is not None:
                result["lr"] = float(lr)
            result["skipped_steps"] = self.skipped_steps
        result["step"] = self.cur_step
        return result

    # ---------------------------------------------------------------- progress
    def progress(self, consumed_train_samples: int = 0) -> dict[str, int]:
        return {
            "cur_step": self.cur_step,
            "consumed_train_samples": int(consumed_train_samples),
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }

    def trainer_state(self, consumed_train_samples: int, **extra: Any) -> dict[str, Any]:
        """This group's ``trainer_state.json`` record: progress, identity, and the backend's ``extra`` fields."""
        import twinkle

        return {**self.progress(consumed_train_samples), "adapter_name": self.name, "is_adapter": self.is_adapter,
                "twinkle_version": twinkle.__version__, **extra}

    def restore_progress(self, state: Mapping[str, Any]) -> dict[str, int]:
        """Continue from a checkpoint's progress (a fresh accumulation window at ``cur_step``); returns it."""
        self.cur_step = int(state["cur_step"])
        self.gradient_accumulation_steps = check_accumulation_steps(int(state["gradient_accumulation_steps"]))
        self.stepped = False
        self.lr_step_pending = False
        self.consecutive_skips = 0
        self._close_window()
        return {k: int(state[k]) for k in ("cur_step", "consumed_train_samples", "gradient_accumulation_steps")}


def lookup_group(groups: Mapping[str, OptimizerGroup], adapter_name: str | None) -> OptimizerGroup:
    """The group for ``adapter_name``; with a single group the name may be omitted. Never a silent fallback."""
    if adapter_name is None:
        if len(groups) == 1:
            return next(iter(groups.values()))
        raise ValueError(f"This model has {len(groups)} adapters ({', '.join(groups)}); pass adapter_name= to say "
                         "which one.")
    group = groups.get(adapter_name)
    if group is None:
        raise KeyError(f"No adapter named {adapter_name!r}; this model has: {', '.join(groups)}. "
                       "Add it with add_adapter_to_model(name, LoraConfig(...)) first.")
    return group
