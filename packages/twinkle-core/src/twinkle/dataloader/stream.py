"""A stream (``IterableDataset``) cut into global batches: this rank's slice, workers, exact resume.

The stream's order (mixing, shuffle buffer) is the same on every rank. It is cut into global
batches of ``batch_size`` rows; rank ``r`` of ``R`` takes rows ``r, r + R, ...`` of each (as for a
map-style dataset) and only then maps and encodes them, so the expensive steps are split over the
ranks. A row a step drops leaves its batch one row short (ranks never wait for one another to
refill). With ``num_workers`` DataLoader worker processes, worker ``w`` transforms the batches
``w, w + W, ...`` counted from where the iteration started; torch's DataLoader hands them back in
that order, so the batches are the same as with no workers.

Progress is counted in raw global rows (``consumed_train_samples``), so a resumed run knows where
it stands from that count alone: the stream is reopened at that position, by seeking the sources
where their format allows and by re-reading otherwise (see ``IterableDataset.rows``); nothing before
it is mapped or encoded again (a pack stream is the exception: its packs are rebuilt up to there).
An epoch is one pass of the stream; resuming in a later epoch counts the stream's rows once
(``IterableDataset.num_rows``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from twinkle.dataloader.sampler import BatchPlan


class StreamBatches:
    """One rank's batches of a stream; ``iterate(epoch, first_batch)`` yields ``(global rows, rank rows)``."""

    def __init__(self, dataset: Any, batch_size: int, min_batch_size: int, data_rank: int, data_world_size: int,
                 shuffle_buffer: int, seed: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.min_batch_size = min_batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self._num_rows: int | None = None

    def plan(self) -> BatchPlan:
        """The epoch's batch layout (needs the stream's length: counted once, then kept)."""
        if self._num_rows is None:
            self._num_rows = self.dataset.num_rows()
        return BatchPlan(num_rows=self._num_rows, batch_size=self.batch_size, min_batch_size=self.min_batch_size,
                         data_world_size=self.data_world_size, shuffle=False, seed=self.seed)

    def position(self, consumed: int) -> tuple[int, int]:
        """(epoch, batch) after ``consumed`` global rows.

        A count on a batch boundary of the first epoch is taken as such without counting the stream;
        :meth:`epoch_is_done` tells the caller when the stream ends there, and then (or for any other
        count) the epoch's length is counted once to place it.
        """
        if consumed % self.batch_size == 0 and self._num_rows is None:
            return 0, consumed // self.batch_size
        return self.plan().position(consumed)

    def placed(self, consumed: int) -> tuple[int, int]:
        """(epoch, batch) after ``consumed`` global rows, counting the stream's length once."""
        return self.plan().position(consumed)

    def chunks(self, epoch: int, first_batch: int) -> Iterator[tuple[int, int, list[tuple[str, Any]]]]:
        """``(batch, global size, this rank's raw rows)`` of the epoch from batch ``first_batch``.

        The epoch's final partial batch is cut to a multiple of the data-parallel size and kept if
        that leaves at least ``min_batch_size`` rows (as in :class:`BatchPlan`).
        """
        B, R = self.batch_size, self.data_world_size
        rows = self.dataset.rows(epoch=epoch, start=first_batch * B, shuffle_buffer=self.shuffle_buffer,
                                 seed=self.seed)
        batch, chunk = first_batch, []
        for item in rows:
            chunk.append(item)
            if len(chunk) == B:
                yield batch, B, chunk[self.data_rank::R]
                batch, chunk = batch + 1, []
        kept = len(chunk) - len(chunk) % R
        if kept and kept >= self.min_batch_size:
            yield batch, kept, chunk[:kept][self.data_rank::R]

    def transform(self, batch: int, mine: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """Map/encode this rank's rows of global batch ``batch`` (positions name rows in errors)."""
        first = batch * self.batch_size + self.data_rank
        indices = list(range(first, first + len(mine) * self.data_world_size, self.data_world_size))
        return self.dataset.transform([row for _, row in mine], [key for key, _ in mine], indices)

    def iterate(self, epoch: int, first_batch: int, worker: int = 0, num_workers: int = 1
                ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        for j, (batch, size, mine) in enumerate(self.chunks(epoch, first_batch)):
            if j % num_workers == worker:
                yield size, self.transform(batch, mine)


class WorkerStream:
    """The torch ``IterableDataset`` each DataLoader worker runs: its share of the epoch's batches."""

    def __init__(self, batches: StreamBatches, epoch: int, first_batch: int, processor: Any) -> None:
        self.batches = batches
        self.epoch = epoch
        self.first_batch = first_batch
        self.processor = processor

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for size, rows in self.batches.iterate(self.epoch, self.first_batch, worker, workers):
            yield size, (self.processor(rows) if self.processor is not None else rows)


def _as_is(item: Any) -> Any:
    return item


def epoch_batches(batches: StreamBatches, epoch: int, first_batch: int, num_workers: int, processor: Any
                  ) -> Iterator[tuple[int, Any]]:
    """``(global rows, this rank's batch)`` for the rest of an epoch, in worker processes if asked."""
    if num_workers == 0:
        for size, rows in batches.iterate(epoch, first_batch):
            yield size, (processor(rows) if processor is not None else rows)
        return
    import torch.utils.data

    source = _TorchStream(WorkerStream(batches, epoch, first_batch, processor))
    yield from torch.utils.data.DataLoader(source, batch_size=None, num_workers=num_workers, collate_fn=_as_is)


def _torch_stream_class() -> type:
    import torch.utils.data

    class TorchStream(torch.utils.data.IterableDataset):
        def __init__(self, inner: WorkerStream) -> None:
            self.inner = inner

        def __iter__(self) -> Iterator[tuple[int, Any]]:
            return iter(self.inner)

    return TorchStream


def _TorchStream(inner: WorkerStream) -> Any:  # noqa: N802 - builds the torch class on first use (torch is heavy)
    global _TORCH_STREAM
    if _TORCH_STREAM is None:
        _TORCH_STREAM = _torch_stream_class()
    return _TORCH_STREAM(inner)


_TORCH_STREAM: type | None = None


class StreamLoader:
    """The DataLoader's side of a stream: an open iterator kept between ``for`` loops, reopened on resume.

    The Trainer re-enters the loader every step; reopening the stream each time would re-read it,
    so the open iterator is kept and continued while the loader's sample count is where it left off.
    """

    def __init__(self, batches: StreamBatches, num_workers: int) -> None:
        self.plan = batches
        self.num_workers = num_workers
        self._live: tuple[int, int, Any, Iterator[tuple[int, Any]]] | None = None  # consumed, epoch, processor, it
        self._epoch_start: tuple[int, int] | None = None  # (consumed, epoch) where an iterated epoch began

    def batches_from(self, consumed: int) -> tuple[int, int]:
        """(epoch, batch) after ``consumed`` global rows; raises for a count no run could have reached."""
        from twinkle.dataset.errors import DataError

        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise DataError(f"consumed_train_samples must be a non-negative integer, got {consumed!r}.")
        if self._epoch_start is not None and consumed == self._epoch_start[0]:
            return self._epoch_start[1], 0
        if self._live is not None and consumed == self._live[0]:
            return self._live[1], -1
        return self.plan.position(consumed)

    def epoch_at(self, consumed: int) -> int:
        if self._epoch_start is not None and consumed == self._epoch_start[0]:
            return self._epoch_start[1]
        if self._live is not None and consumed == self._live[0]:
            return self._live[1]
        return self.plan.placed(consumed)[0] if consumed else 0

    def batches(self, consumed: int, processor: Any) -> Iterator[tuple[int, Any]]:
        if self._live is not None and self._live[0] == consumed and self._live[2] is processor:
            _, epoch, _, it = self._live
            first = -1
        else:
            epoch, first = self.batches_from(consumed)
            it = epoch_batches(self.plan, epoch, first, self.num_workers, processor)
            if epoch == 0 and first > 0 and self.plan._num_rows is None:
                # taken as a position in the first epoch without counting: if the stream ends right there,
                # the count was in a later epoch, which only the stream's length can place
                head = next(it, None)
                if head is None:
                    epoch, first = self.plan.placed(consumed)
                    it = epoch_batches(self.plan, epoch, first, self.num_workers, processor)
                else:
                    it = itertools.chain([head], it)
        position, yielded = consumed, False
        for size, batch in it:
            position += size
            yielded = True
            self._live = (position, epoch, processor, it)
            yield size, batch
        if first == 0 and not yielded:
            from twinkle.dataset.errors import DataError

            raise DataError(f"epoch {epoch} of the stream gave no batch of batch_size={self.plan.batch_size} "
                            f"(min_batch_size={self.plan.min_batch_size}); use more rows or a smaller batch_size.")
        self._live, self._epoch_start = None, (position, epoch + 1)
