"""InfoNCE for sentence embeddings: each query must pick its positive among all batch documents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss, output_field


class InfoNCELoss(Loss):
    """Contrastive loss over groups of rows ``[query, positive, hard negatives...]``.

    The batch's ``embeddings`` come in consecutive groups of ``group_size`` rows (2 = pairs).
    Every query is scored (cosine / ``temperature``) against every non-query row of the batch,
    so the other groups' positives and negatives serve as in-batch negatives. An item is a query.
    ``inputs['group_size']`` overrides the constructor's value for one batch.
    """

    task = "embedding"

    def __init__(self, temperature: float = 0.05, group_size: int = 2, reduction: str = "mean") -> None:
        super().__init__(reduction)
        if temperature <= 0:
            raise ValueError(f"InfoNCELoss temperature must be > 0, got {temperature!r}.")
        if group_size < 2:
            raise ValueError(f"InfoNCELoss group_size must be >= 2 (query + positive), got {group_size!r}.")
        self.temperature = temperature
        self.group_size = group_size

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, int]:
        embeddings = output_field(outputs, "embeddings").float()
        group = int(inputs.get("group_size", self.group_size)) if isinstance(inputs, Mapping) else self.group_size
        rows = embeddings.shape[0]
        if rows % group:
            raise ValueError(
                f"InfoNCELoss: {rows} embedding rows are not a whole number of groups of {group} "
                "(query, positive, negatives...); build batches with complete groups."
            )
        embeddings = F.normalize(embeddings, dim=-1)
        groups = embeddings.view(rows // group, group, -1)
        queries = groups[:, 0]
        documents = groups[:, 1:].reshape(-1, embeddings.shape[-1])
        scores = queries @ documents.T / self.temperature
        targets = torch.arange(queries.shape[0], device=scores.device) * (group - 1)
        total = F.cross_entropy(scores, targets, reduction="sum")
        return total, queries.shape[0]
