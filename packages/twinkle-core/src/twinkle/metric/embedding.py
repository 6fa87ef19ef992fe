"""EmbeddingMetric: how close each query's embedding is to its positive and to its negatives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.metric.builtin import Metric


class EmbeddingMetric(Metric):
    """Mean cosine similarity of query and positive (``pos_sim``) and of query and its negatives (``neg_sim``).

    Rows come in groups of ``group_size`` (query, positive, negatives...), as :class:`~twinkle.loss.InfoNCELoss`
    reads them (``inputs['group_size']`` overrides). Embeddings are ``outputs['embeddings']``, else 2-D
    ``logits``, else the first position of 3-D ``logits``. A ``loss`` in the outputs is averaged as ``loss``.

    Args:
        group_size: rows per group (>= 2).
        device_mesh, process_group: upstream Twinkle's arguments, kept (see :class:`Metric`).
    """

    def __init__(self, group_size: int = 2, device_mesh: Any = None, process_group: Any = None,
                 **kwargs: Any) -> None:
        self.group_size = group_size
        self.device_mesh, self.process_group = device_mesh, process_group
        self.reset()

    def update(self, inputs: Mapping[str, Any], outputs: Any) -> None:
        self.accumulate(inputs, outputs)

    def accumulate(self, inputs: Mapping[str, Any] | None = None, outputs: Any = None, **kwargs: Any) -> None:
        """Add one batch of groups."""
        if not isinstance(outputs, Mapping):
            return
        emb = outputs.get("embeddings")
        if emb is None and isinstance(outputs.get("logits"), torch.Tensor):
            logits = outputs["logits"]
            emb = logits if logits.dim() == 2 else logits[:, 0]
        if emb is None:
            return
        group = int((inputs or {}).get("group_size", self.group_size))
        if emb.shape[0] % group:
            raise ValueError(f"EmbeddingMetric: {emb.shape[0]} rows are not whole groups of {group} (query, positive, "
                             "negatives...).")
        groups = F.normalize(emb.detach().float(), dim=-1).view(emb.shape[0] // group, group, -1)
        sims = (groups[:, :1] * groups[:, 1:]).sum(dim=-1)  # (groups, group - 1): query against the rest
        self._pos = self._pos + sims[:, 0].sum()
        self.pos_count += sims.shape[0]
        if group > 2:
            self._neg = self._neg + sims[:, 1:].sum()
            self._neg_count += sims[:, 1:].numel()
        if outputs.get("loss") is not None:
            self._loss = self._loss + outputs["loss"].detach().float()
            self._loss_count += 1

    def compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.pos_count:
            out["pos_sim"] = float(self._pos) / self.pos_count
        if self._neg_count:
            out["neg_sim"] = float(self._neg) / self._neg_count
        if self._loss_count:
            out["loss"] = float(self._loss) / self._loss_count
        return out

    def reset(self) -> None:
        self._pos: Any = 0.0
        self._neg: Any = 0.0
        self._loss: Any = 0.0
        self.pos_count = self._neg_count = self._loss_count = 0
