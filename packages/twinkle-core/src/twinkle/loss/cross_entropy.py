"""Next-token cross-entropy over the labels a template produced (-100 marks untrained tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX, SHIFT_LABELS
from twinkle.loss.base import Loss, output_field

#: how tokens are weighted (xtuner's CELossConfig.loss_reduction): each token the same, each sample the same
#: (1 / its trained tokens), or 1 / sqrt(its trained tokens)
LOSS_REDUCTIONS = ("token", "sample", "square")


class CrossEntropyLoss(Loss):
    """Logits at position t predict ``labels[t + 1]``; ``ignore_index`` positions are skipped.

    The mean is over trained tokens, so accumulating micro-batches by their token counts gives
    exactly the loss of the concatenated batch. ``loss_reduction='sample'`` / ``'square'`` weight each
    token by 1 / n or 1 / sqrt(n) of its row's n trained tokens (rows of a padded batch); the mean is then
    over those weights, so accumulation stays exact.

    Flat ``(tokens,)`` labels with ``(tokens, vocab)`` logits are already aligned (``logits[i]``
    scores ``labels[i]``): upstream Twinkle's pre-shifted form. Outputs that carry ``logps`` instead
    of ``logits`` are averaged the same way; like every per-token field of label rows they are
    aligned with the tokens: ``logps[:, t]`` is the log-probability of ``labels[:, t]`` (which
    ``logits[:, t - 1]`` predicted). ``dft=True`` weighs each token's ``-log p`` by its probability
    ``p`` taken as a constant (Wu et al. 2025, "dynamic fine-tuning").

    Args:
        reduction: ``'mean'`` over trained tokens or their ``'sum'``.
        ignore_index: the label of untrained positions.
        loss_reduction: ``'token'``, ``'sample'`` or ``'square'`` (see above).
        dft: weigh each token by its detached probability.
    """

    def __init__(self, reduction: str = "mean", ignore_index: int = IGNORE_INDEX,
                 loss_reduction: str = "token", dft: bool = False) -> None:
        super().__init__(reduction)
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}.")
        self.ignore_index = ignore_index
        self.loss_reduction = loss_reduction
        self.dft = bool(dft)

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if "labels" not in inputs and SHIFT_LABELS not in inputs:
            raise KeyError("CrossEntropyLoss needs 'labels' in the inputs (encode the dataset with a template).")
        if _has(outputs, "logps") and not _has(outputs, "logits"):
            return self._from_logps(torch.as_tensor(inputs["labels"]), output_field(outputs, "logps"))
        logits = outputs["logits"] if isinstance(outputs, Mapping) and "logits" in outputs else \
            output_field(outputs, "logits")
        # shift the labels, not the logits: a slice of the (batch, seq, vocab) logits would be copied
        targets = self.next_tokens(inputs, logits.device)
        shift_labels = targets.reshape(-1)
        flat_logits = logits.reshape(-1, logits.shape[-1])
        if flat_logits.dtype != torch.float32:
            flat_logits = flat_logits.float()
        if self.loss_reduction != "token" or self.dft:
            per_token = self.token_losses(flat_logits, shift_labels)
            return self._reduce(per_token, shift_labels, targets.shape)
        total = F.cross_entropy(flat_logits, shift_labels, ignore_index=self.ignore_index, reduction="sum")
        items = (shift_labels != self.ignore_index).sum()
        return total, items

    def next_tokens(self, inputs: Mapping[str, Any], device: torch.device) -> torch.Tensor:
        """Each position's target, aligned with the logits: ``shift_labels`` when given (sequence parallelism
        shifted them over the whole row), else the labels shifted here."""
        given = inputs.get(SHIFT_LABELS)
        if given is not None:
            return torch.as_tensor(given).to(device)
        return self.shifted(torch.as_tensor(inputs["labels"]).to(device))

    def shifted(self, labels: torch.Tensor) -> torch.Tensor:
        """``labels`` moved one position left (position t's target is ``labels[t + 1]``), the last ignored.

        Flat labels ``(tokens,)`` (with logits ``(tokens, vocab)``) have no sequence axis to shift along:
        they are read as already aligned (``logits[i]`` scores ``labels[i]``), upstream Twinkle's form.
        """
        if labels.dim() == 1:
            return labels
        return F.pad(labels, (0, 1), value=self.ignore_index)[..., 1:]

    def token_losses(self, flat_logits: torch.Tensor, flat_targets: torch.Tensor) -> torch.Tensor:
        """Per-position ``-log p`` (``dft``: times the detached ``p``), 0 where ignored."""
        nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=self.ignore_index, reduction="none")
        return nll * torch.exp(-nll).detach() if self.dft else nll

    def _from_logps(self, labels: torch.Tensor, logps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = labels.to(logps.device)
        if logps.shape != labels.shape:
            raise ValueError(f"CrossEntropyLoss: outputs['logps'] has shape {tuple(logps.shape)} but the labels "
                             f"{tuple(labels.shape)}; give one log-probability per position.")
        targets = labels.reshape(-1)  # the logps are aligned with the tokens: no shift
        flat = logps.reshape(-1).float()
        nll = -torch.where(targets != self.ignore_index, flat, torch.zeros_like(flat))
        per_token = nll * torch.exp(-nll).detach() if self.dft else nll
        return self._reduce(per_token, targets, labels.shape)

    def _reduce(self, per_token: torch.Tensor, targets: torch.Tensor, shape: torch.Size
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loss_reduction == "token":
            return per_token.sum(), (targets != self.ignore_index).sum()
        return self._weighted(per_token, targets, shape)

    def _weighted(self, per_token: torch.Tensor, shift_labels: torch.Tensor, shape: torch.Size
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(shape) != 2:
            raise ValueError(f"loss_reduction={self.loss_reduction!r} weights the rows of a padded (batch, sequence) "
                             f"batch; this one has shape {tuple(shape)}.")
        trained = (shift_labels != self.ignore_index).reshape(shape).float()
        counts = trained.sum(dim=1, keepdim=True).clamp(min=1)
        weights = trained / (counts if self.loss_reduction == "sample" else counts.sqrt())
        weights = weights * (trained.sum(dim=1, keepdim=True) > 0)
        return (per_token.reshape(shape) * weights).sum(), weights.sum()


def _has(outputs: Any, name: str) -> bool:
    if isinstance(outputs, Mapping):
        return outputs.get(name) is not None
    return getattr(outputs, name, None) is not None
