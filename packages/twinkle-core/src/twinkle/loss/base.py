"""The Loss base class: sum + item count, so accumulation can weight micro-batches exactly."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from twinkle.types import InputFeature, ModelOutput

REDUCTIONS = ("mean", "sum")


class Loss(ABC):
    """Base class of twinkle losses.

    Subclasses implement :meth:`compute`, returning ``(sum of item losses, number of items)``;
    an item is whatever the mean averages over (a trained token for cross-entropy, a query for
    InfoNCE). ``loss(inputs, outputs)`` then returns upstream Twinkle's :class:`LossOutput`:
    ``{'loss': the sum or the mean per reduction, 'num_tokens': the item count}``.
    ``inputs`` is the collated batch (:class:`twinkle.types.InputFeature`), ``outputs`` the forward's
    result (:class:`twinkle.types.ModelOutput`). A plain function ``fn(inputs, outputs) -> tensor``
    works with ``set_loss`` too; it returns the batch's mean.

    A loss whose batch must have a structure (the preference losses' pairs) may also define
    ``check_batch(batch)``: collation calls it on the host with the collated batch, before the forward,
    so ``compute`` need not read anything back from the device to validate it.
    """

    #: The forward flavour this loss reads (``causal_lm`` logits, ``embedding`` vectors, ``fused_lm_ce``
    #: hidden states + lm_head); a model's forward uses it when the caller gives no ``task=``.
    task: str = "causal_lm"

    def __init__(self, reduction: str = "mean") -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
        self.reduction = reduction

    @abstractmethod
    def compute(self, inputs: InputFeature, outputs: ModelOutput, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """``(sum of per-item losses, number of items)`` for one batch.

        The count may be an int or a 0-dim tensor; a tensor avoids a device-to-host sync.
        """

    def __call__(self, inputs: InputFeature, outputs: ModelOutput, **kwargs: Any) -> LossOutput:
        """The batch's loss as upstream Twinkle's losses return it (a model calls :meth:`compute` instead).

        Returns:
            ``{'loss': 0-dim tensor (sum or mean per reduction), 'num_tokens': the item count as a tensor}``.
        """
        total, items = self.compute(inputs, outputs, **kwargs)
        count = items if isinstance(items, torch.Tensor) else torch.tensor(items, device=total.device)
        value = total if self.reduction == "sum" else total / count.clamp(min=1)
        return LossOutput(loss=value, num_tokens=count)


class LossOutput(dict):
    """What calling a :class:`Loss` returns: ``loss`` (the reduced value) and ``num_tokens`` (its item count).

    A plain dict (upstream Twinkle's ``LossOutput`` keys); read ``out['loss']``.
    """


def output_field(outputs: Any, name: str) -> Any:
    """``outputs[name]`` for dicts and HF ModelOutput alike, with an error naming what is there."""
    if isinstance(outputs, Mapping):
        if name in outputs:
            return outputs[name]
        have = list(outputs.keys())
    else:
        value = getattr(outputs, name, None)
        if value is not None:
            return value
        have = [k for k in dir(outputs) if not k.startswith("_")]
    raise KeyError(f"The model outputs have no {name!r} (they have: {', '.join(map(str, have))}). "
                   "Check the task= of the forward and the loss set with set_loss().")
