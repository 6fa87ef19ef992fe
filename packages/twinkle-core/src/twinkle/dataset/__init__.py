"""Datasets: sources described by DatasetMeta, loaded with HF ``datasets``, preprocessed, mixed and encoded."""

from __future__ import annotations

from twinkle.dataset.dataset import Dataset
from twinkle.dataset.errors import DataError
from twinkle.dataset.meta import DatasetMeta

__all__ = ["DataError", "Dataset", "DatasetMeta"]
