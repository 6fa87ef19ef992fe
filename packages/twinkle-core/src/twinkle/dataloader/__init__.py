"""DataLoader: global batches sharded over data-parallel ranks, with exact resume."""

from __future__ import annotations

from twinkle.dataloader.dataloader import DataLoader
from twinkle.dataloader.sampler import BatchPlan

__all__ = ["BatchPlan", "DataLoader"]
