"""GKD (Agarwal et al. 2024, on-policy distillation): a generalised Jensen-Shannon divergence to a teacher."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX
from twinkle.loss.base import Loss, output_field
from twinkle.utils.checks import check_int


class GKDLoss(Loss):
    """Per trained token, the divergence between the student's and the teacher's next-token distributions.

    With ``S`` and ``T`` the student's and teacher's distributions (logits over ``temperature``) and
    ``M = beta T + (1 - beta) S``, the loss is ``beta KL(T || M) + (1 - beta) KL(S || M)``; its end points
    are taken as the limits' directions, as TRL's GKDTrainer does: ``beta = 0`` is the forward
    ``KL(T || S)``, ``beta = 1`` the reverse ``KL(S || T)``. The mean is over trained tokens (labels
    shifted as :class:`CrossEntropyLoss` shifts them), so micro-batches accumulate exactly.

    The teacher's logits (same shape as the student's) come as ``teacher_logits=`` in the call, or as
    ``teacher_logits`` in the outputs or the inputs. A teacher known only by its top ``k`` tokens per
    position (an API teacher) comes as ``teacher_topk_logprobs=`` and ``teacher_topk_indices=``
    (``(rows, T, k)``); with ``topk`` set, full teacher logits are cut to their top ``k``. Then both
    distributions are renormalised over those ``k`` tokens and compared there.

    Args:
        beta: the interpolation in [0, 1].
        temperature: divides both logits (> 0).
        ignore_index: the label of untrained positions.
        chunk_size: positions per chunk of the vocabulary-wide computation (bounds its memory).
        topk: compare on the teacher's top ``k`` tokens only (None: the whole vocabulary).
    """

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = IGNORE_INDEX,
                 chunk_size: int = 512, reduction: str = "mean", topk: int | None = None) -> None:
        super().__init__(reduction)
        self.topk = None if topk is None else check_int(topk, "GKDLoss: topk")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"GKDLoss: beta must be in [0, 1], got {beta!r}.")
        if not temperature > 0:
            raise ValueError(f"GKDLoss: temperature must be > 0, got {temperature!r}.")
        self.beta, self.temperature, self.ignore_index = float(beta), float(temperature), ignore_index
        self.chunk_size = check_int(chunk_size, "GKDLoss: chunk_size")

    def compute(self, inputs: Mapping[str, Any], outputs: Any, teacher_logits: torch.Tensor | None = None, *,
                teacher_topk_logprobs: torch.Tensor | None = None, teacher_topk_indices: torch.Tensor | None = None,
                topk: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if kwargs:
            raise TypeError(f"GKDLoss takes the call options teacher_logits=, teacher_topk_logprobs=, "
                            f"teacher_topk_indices= and topk=, got {sorted(kwargs)}.")
        student = output_field(outputs, "logits")
        indices = None
        if teacher_topk_logprobs is not None or teacher_topk_indices is not None:
            teacher, indices = _topk_teacher(teacher_topk_logprobs, teacher_topk_indices, student)
        else:
            teacher = teacher_logits if teacher_logits is not None else _teacher(outputs, inputs)
            if teacher.shape != student.shape:
                raise ValueError(f"GKDLoss: teacher logits have shape {tuple(teacher.shape)} but the student's "
                                 f"{tuple(student.shape)}; the teacher must score the same tokens with one "
                                 "vocabulary.")
            k = topk if topk is not None else self.topk
            if k is not None:
                teacher, indices = teacher.detach().topk(check_int(k, "GKDLoss: topk"), dim=-1)
        if indices is not None:  # compare on the teacher's k tokens: the student's logits there
            student = student.gather(-1, indices.to(student.device).long())
        if "labels" not in inputs:
            raise KeyError("GKDLoss needs 'labels' in the inputs (the positions to distil: -100 elsewhere).")
        labels = torch.as_tensor(inputs["labels"]).to(student.device)
        trained = (F.pad(labels, (0, 1), value=self.ignore_index)[..., 1:] != self.ignore_index).reshape(-1)
        flat_s = student.reshape(-1, student.shape[-1])
        flat_t = teacher.to(student.device).reshape(-1, teacher.shape[-1]).detach()
        total = flat_s.new_zeros((), dtype=torch.float64 if flat_s.dtype == torch.float64 else torch.float32)
        for start in range(0, flat_s.shape[0], self.chunk_size):
            part = slice(start, start + self.chunk_size)
            divergence = self.divergence(flat_s[part], flat_t[part])
            total = total + torch.where(trained[part], divergence, torch.zeros_like(divergence)).sum()
        return total, trained.sum()

    def divergence(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        """The per-position divergence (positions,) of two (positions, vocab) logits."""
        dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32  # at least float32
        s = F.log_softmax(student_logits.to(dtype) / self.temperature, dim=-1)
        t = F.log_softmax(teacher_logits.to(dtype) / self.temperature, dim=-1)
        if self.beta == 0:
            return _kl(t, s)
        if self.beta == 1:
            return _kl(s, t)
        mixture = torch.logsumexp(torch.stack([s + math.log(1 - self.beta), t + math.log(self.beta)]), dim=0)
        return self.beta * _kl(t, mixture) + (1 - self.beta) * _kl(s, mixture)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(dim=-1)


def _topk_teacher(logprobs: torch.Tensor | None, indices: torch.Tensor | None, student: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    if logprobs is None or indices is None:
        raise ValueError("GKDLoss: give both teacher_topk_logprobs= and teacher_topk_indices= (rows, T, k).")
    logprobs, indices = torch.as_tensor(logprobs), torch.as_tensor(indices)
    if logprobs.shape != indices.shape or logprobs.shape[:-1] != student.shape[:-1]:
        raise ValueError(f"GKDLoss: teacher_topk_logprobs {tuple(logprobs.shape)} and teacher_topk_indices "
                         f"{tuple(indices.shape)} must both be (rows, T, k) over the student's "
                         f"{tuple(student.shape[:-1])} positions.")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= student.shape[-1]):
        raise ValueError(f"GKDLoss: teacher_topk_indices must be token ids below the vocabulary size "
                         f"{student.shape[-1]}.")
    # log-probabilities shift every logit of a position by one constant, which the renormalisation removes
    return logprobs.to(student.device), indices


def _teacher(outputs: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
    if isinstance(outputs, Mapping) and outputs.get("teacher_logits") is not None:
        return outputs["teacher_logits"]
    if getattr(outputs, "teacher_logits", None) is not None:
        return outputs.teacher_logits
    if isinstance(inputs, Mapping) and inputs.get("teacher_logits") is not None:
        return torch.as_tensor(inputs["teacher_logits"])
    raise KeyError("GKDLoss needs the teacher's logits: pass teacher_logits= (a teacher model's forward_only "
                   "logits on the same batch), or put 'teacher_logits' in the outputs or the inputs.")
