"""Which global rows make batch *b* of epoch *e*, and where a sample count puts a resumed run.

Everything is a pure function of (dataset size, batch size, data-parallel size, shuffle, seed),
so every rank computes the same global batches without talking to the others, and a run resumed
from ``consumed_train_samples`` sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.dataset.errors import DataError


@dataclass(frozen=True)
class BatchPlan:
    """The batches of every epoch.

    ``batch_size`` is global and must split evenly over ``data_world_size`` ranks. The last,
    partial batch of an epoch (``num_rows % batch_size`` rows) is cut down to a multiple of the
    data-parallel size and kept only if that leaves at least ``min_batch_size`` rows.
    """

    num_rows: int
    batch_size: int
    min_batch_size: int
    data_world_size: int
    shuffle: bool
    seed: int

    def __post_init__(self) -> None:
        b, r = self.batch_size, self.data_world_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise DataError(f"batch_size must be a positive integer, got {b!r}.")
        if b % r:
            raise DataError(
                f"batch_size={b} is global and must divide evenly over the {r} data-parallel ranks; "
                f"use a multiple of {r} (e.g. {max(r, b - b % r)})."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {self.seed!r}.")
        if not 1 <= self.min_batch_size <= b:
            raise DataError(f"min_batch_size must be between 1 and batch_size={b}, got {self.min_batch_size}.")
        if self.batches_per_epoch == 0:
            raise DataError(
                f"The dataset has {self.num_rows} rows: not one batch of batch_size={b} "
                f"(min_batch_size={self.min_batch_size}, {r} data-parallel ranks) can be formed. "
                "Use more rows or a smaller batch_size/min_batch_size."
            )

    @property
    def last_batch_size(self) -> int:
        """Rows in the epoch's final partial batch (0 when there is none or it is dropped)."""
        rest = self.num_rows % self.batch_size
        kept = rest - rest % self.data_world_size
        return kept if kept >= self.min_batch_size and kept > 0 else 0

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.batch_size + (1 if self.last_batch_size else 0)

    @property
    def samples_per_epoch(self) -> int:
        return self.num_rows // self.batch_size * self.batch_size + self.last_batch_size

    def order(self, epoch: int) -> Sequence[int]:
        """Row order of an epoch: a permutation seeded by (seed, epoch), or 0..n-1 without shuffle.

        The permutation is a NumPy array (8 bytes a row, no Python ints); without shuffle it is a
        ``range`` and nothing is materialised. Callers compute it once per epoch.
        """
        if not self.shuffle:
            return range(self.num_rows)
        import numpy as np

        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def global_batch(self, order: Sequence[int], batch: int) -> list[int]:
        """The row indices of global batch ``batch`` of an epoch whose order is ``order``."""
        start = batch * self.batch_size
        size = self.batch_size if batch < self.num_rows // self.batch_size else self.last_batch_size
        piece: Any = order[start:start + size]
        return piece.tolist() if hasattr(piece, "tolist") else list(piece)

    def rank_slice(self, global_batch: list[int], data_rank: int) -> list[int]:
        """Rank r of R takes rows r, r+R, r+2R, ... of the global batch: disjoint, equal sizes."""
        return global_batch[data_rank::self.data_world_size]

    def position(self, consumed: int) -> tuple[int, int]:
        """(epoch, batch) that comes after ``consumed`` global samples."""
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise DataError(f"consumed_train_samples must be a non-negative integer, got {consumed!r}.")
        epoch, within = divmod(consumed, self.samples_per_epoch)
        if within % self.batch_size:
            raise DataError(
                f"consumed_train_samples={consumed} does not fall on a batch boundary: an epoch is "
                f"{self.samples_per_epoch} samples in batches of {self.batch_size}. Resume with the batch_size, "
                "min_batch_size and dataset size of the run that saved the checkpoint."
            )
        return epoch, within // self.batch_size
