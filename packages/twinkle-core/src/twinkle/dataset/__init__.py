"""Datasets: sources described by DatasetMeta, loaded with HF ``datasets``, preprocessed, mixed and encoded.

``Dataset`` maps and encodes the whole table up front; ``LazyDataset`` on access; ``IterableDataset``
streams; ``PackingDataset`` / ``IterablePackingDataset`` pack encoded rows to a token budget.
"""

from __future__ import annotations

from twinkle.dataset.dataset import Dataset
from twinkle.dataset.errors import DataError
from twinkle.dataset.iterable_dataset import IterableDataset
from twinkle.dataset.iterable_packing_dataset import IterablePackingDataset
from twinkle.dataset.lazy_dataset import LazyDataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing_dataset import PackingDataset

__all__ = ["DataError", "Dataset", "DatasetMeta", "IterableDataset", "IterablePackingDataset", "LazyDataset",
           "PackingDataset"]
