"""Plain-torch cross-entropy on materialised logits, with the same result type as the fused kernels."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX

REDUCTIONS = ("mean", "sum")


class FusedCEOutput(NamedTuple):
    """``loss`` (0-dim fp32, per ``reduction``), ``num_correct`` and ``num_tokens`` (0-dim int64 tensors).

    ``num_tokens`` counts labels that are not ``ignore_index``; ``num_correct`` those whose arg-max
    prediction equals the label (token accuracy = num_correct / num_tokens). With no trained
    token at all the loss is 0 for both reductions (not NaN) and its gradients are zero.
    """

    loss: torch.Tensor
    num_correct: torch.Tensor
    num_tokens: torch.Tensor


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                  reduction: str = "mean") -> FusedCEOutput:
    """Cross-entropy of ``logits`` (N, V) against ``labels`` (N,), computed in fp32."""
    check_reduction(reduction)
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1).to(logits.device)
    valid = labels != ignore_index
    total = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    num_tokens = valid.sum()
    correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
    loss = total / num_tokens.clamp(min=1) if reduction == "mean" else total
    return FusedCEOutput(loss, correct, num_tokens)
