"""The Metric base class and the two metrics every group starts with: the loss and token accuracy.

A model feeds each metric of a group with every forward (:meth:`Metric.update`) and every computed
loss (:meth:`Metric.update_loss`). Updates keep device tensors (no ``.item()``) so a training step
never waits on the device for a metric; the one host sync happens in :meth:`Metric.compute`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.constants import IGNORE_INDEX, SHIFT_LABELS


class Metric:
    """Accumulates over batches; ``compute`` returns ``{name: float}``; ``reset`` starts over.

    Updates should keep device tensors (no ``.item()``) so a training step never waits on the
    device for a metric; the one host sync happens in :meth:`compute`.

    Upstream Twinkle's spelling works too: ``accumulate(inputs, outputs, **kwargs)`` (a forward's
    inputs and outputs; outputs with a ``loss`` feed :meth:`update_loss`) and ``calculate()``
    (:meth:`compute`). Its constructors take ``device_mesh=`` and ``process_group=``; twinkle's metrics
    reduce over the data-parallel group of the running job instead, so those are kept, not used.
    """

    device_mesh: Any = None
    process_group: Any = None

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, **kwargs: Any) -> None:
        """Upstream's update: the forward's inputs and outputs (a ``loss`` in the outputs counts too)."""
        if isinstance(inputs, (list, tuple)):
            raise TypeError(f"{type(self).__name__}.accumulate takes one batch (a mapping), got a "
                            f"{type(inputs).__name__}; call it once per micro-batch.")
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else None
        if loss is not None:
            count = outputs.get("num_tokens")
            self.update_loss(loss, 1 if count is None else count)
        if inputs is not None and outputs is not None:
            self.update(inputs, outputs)

    def calculate(self) -> dict[str, float]:
        """Upstream's name of :meth:`compute`."""
        return self.compute()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        """Called after every forward with the model inputs and outputs."""

    def update_loss(self, loss_sum: Any, num_items: Any) -> None:
        """Called after every loss computation with the loss sum and the items it covers (int or tensor)."""

    def compute(self) -> dict[str, float]:
        """The accumulated values as plain numbers (empty when nothing was accumulated)."""
        return {}

    def reset(self) -> None:
        """Forget everything accumulated."""


class LossMetric(Metric):
    """Token-weighted mean loss: sum of loss sums / sum of items, reported as ``loss``.

    Args:
        name: the key it reports.
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, name: str = "loss", device_mesh: Any = None, process_group: Any = None,
                 **kwargs: Any) -> None:
        self.name = name
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, *,
                   loss_reduction: str = "mean", num_tokens: Any = None, grad_norm: Any = None,
                   **kwargs: Any) -> None:
        """Upstream's form: ``outputs['loss']`` is a mean over ``num_tokens`` (or a sum, ``loss_reduction='sum'``).

        ``grad_norm`` is reported as the last one given.
        """
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else None
        if grad_norm is not None:
            self._grad_norm = float(grad_norm)
        if loss is None:
            return
        count = num_tokens if num_tokens is not None else outputs.get("num_tokens")
        count = 1 if count is None else count
        self.update_loss(loss * count if loss_reduction == "mean" else loss, count)

    @property
    def total_loss(self) -> float:
        """What has been accumulated (upstream's attribute): the loss sum."""
        return 0.0 if self._sum is None else float(self._sum)

    @property
    def total_count(self) -> float:
        """The items the accumulated loss covers (upstream's attribute)."""
        return float(self._items)

    def update_loss(self, loss_sum: Any, num_items: Any) -> None:
        value = loss_sum.detach() if hasattr(loss_sum, "detach") else loss_sum
        self._sum = value if self._sum is None else self._sum + value
        self._items = self._items + num_items

    def compute(self) -> dict[str, float]:
        from twinkle import collective  # imports torch: not at module load (the CLI runs without it)

        total, items, seen = collective.sum_floats([0.0 if self._sum is None else self._sum, self._items,
                                                    0.0 if self._sum is None else 1.0], collective.data_group())
        out = {} if not seen else {self.name: total / max(items, 1.0)}
        if self._grad_norm is not None:
            out["grad_norm"] = self._grad_norm
        return out

    def reset(self) -> None:
        self._sum: Any = None
        self._items = 0
        self._grad_norm: float | None = None


def _logits(outputs: Any) -> Any:
    if isinstance(outputs, Mapping):
        return outputs.get("logits")
    return getattr(outputs, "logits", None)


class TokenAccuracy(Metric):
    """Share of trained tokens whose arg-max prediction equals the label.

    Labels ``(rows, tokens)`` are twinkle's (``logits[:, t]`` predicts ``labels[:, t + 1]``); flat labels
    ``(tokens,)`` with ``(tokens, vocab)`` logits are already aligned, upstream Twinkle's pre-shifted form.
    Batches without logits or labels (an embedding forward, say) are skipped. Outputs with a
    ``token_matches(inputs, ignore_index)`` method give the counts themselves (Megatron's
    vocabulary-parallel logits: no rank holds the whole vocabulary's arg-max).
    """

    def __init__(self, name: str = "token_accuracy", ignore_index: int = IGNORE_INDEX, device_mesh: Any = None,
                 process_group: Any = None, **kwargs: Any) -> None:
        self.name = name
        self.ignore_index = ignore_index
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        matches = getattr(outputs, "token_matches", None)
        if matches is not None:  # outputs that count their arg-max themselves (vocabulary-parallel logits)
            counts = matches(inputs, self.ignore_index)
            if counts is not None:
                self.update_counts(*counts)
            return
        logits = _logits(outputs)
        shifted = inputs.get(SHIFT_LABELS) if isinstance(inputs, Mapping) else None
        labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
        if logits is None or (labels is None and shifted is None) or logits.dim() < 2:
            return
        if shifted is not None:  # already aligned with the logits (sequence parallelism)
            labels, predictions = shifted.to(logits.device), logits.detach().argmax(dim=-1)
        else:
            labels = labels.to(logits.device)
            predictions = logits.detach().argmax(dim=-1)
            if labels.dim() > 1:  # (rows, tokens): logits[:, t] predicts labels[:, t + 1]
                labels, predictions = labels[..., 1:], predictions[..., :-1]
            # flat (tokens,) labels with (tokens, vocab) logits are already aligned (upstream Twinkle's form)
        mask = labels != self.ignore_index
        self.update_counts(((predictions == labels) & mask).sum(), mask.sum())

    def update_counts(self, correct: Any, total: Any) -> None:
        """Add counts a loss computed itself (the fused CE path never materialises logits)."""
        self._correct = correct if self._correct is None else self._correct + correct
        self._total = total if self._total is None else self._total + total

    def compute(self) -> dict[str, float]:
        from twinkle import collective  # imports torch: not at module load (the CLI runs without it)

        correct, total = collective.sum_floats([self._correct or 0, self._total or 0], collective.data_group())
        if total == 0:
            return {}
        return {self.name: correct / total}

    def reset(self) -> None:
        self._correct: Any = None
        self._total: Any = None

    @property
    def total_correct(self) -> float:
        """Correct predictions accumulated (upstream's attribute)."""
        return float(self._correct or 0)

    @property
    def total_count(self) -> float:
        """Predictions accumulated (upstream's attribute)."""
        return float(self._total or 0)


class Accuracy(TokenAccuracy):
    """Upstream Twinkle's name: next-token accuracy reported as ``accuracy``.

    Labels follow twinkle's convention (``logits[:, t]`` predicts ``labels[:, t + 1]``), as the template
    produces them; ``completion_mask`` in the inputs (True where a token counts) narrows the count further.
    """

    def __init__(self, name: str = "accuracy", ignore_index: int = IGNORE_INDEX, device_mesh: Any = None,
                 process_group: Any = None, **kwargs: Any) -> None:
        super().__init__(name, ignore_index, device_mesh, process_group)

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        mask = inputs.get("completion_mask") if isinstance(inputs, Mapping) else None
        labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
        if mask is not None and labels is not None:
            import torch

            keep = torch.as_tensor(mask, device=labels.device).bool()
            inputs = {**inputs, "labels": torch.where(keep, labels, torch.full_like(labels, self.ignore_index))}
        super().update(inputs, outputs)
