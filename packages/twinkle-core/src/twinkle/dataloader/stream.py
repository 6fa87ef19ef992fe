"""A stream (``IterableDataset``) cut into full global batches: this rank's slice, workers, exact resume.

The stream's order (mixing, shuffle buffer) is the same on every rank. It is read in chunks of
``batch_size`` raw rows. Each chunk is mapped and encoded whole, on every rank, so every rank knows
which rows a step dropped (a filter, a preprocessor returning None, a row too long) or split without
talking to the others; the surviving rows are cut into global batches of ``batch_size``: a dropped
row is replaced by the next one and batches stay full. Rank ``r`` of ``R`` takes rows ``r, r + R,
...`` of each batch. A pipeline whose steps keep every row (none, or only per-row ``map`` functions;
a pack stream, whose packs pass through) has batch ``k`` = chunk ``k``, and each rank transforms only
its own rows of it.

With ``num_workers`` DataLoader worker processes, worker ``w`` transforms the chunks ``w, w + W, ...``
counted from where the iteration started; torch hands them back in that order and the batches are
cut here, so they are the same as with no workers. Workers start with the process start method
torch uses (``fork`` on Linux) or the one given; any other than ``fork`` sends the dataset to each
worker by pickling, checked before a worker starts.

Progress is counted in global rows handed out (``consumed_train_samples``); where the next row is
(:class:`StreamPosition`: epoch, chunk, rows of that chunk already handed out) is kept beside it
(``DataLoader.get_state()['stream_position']``, saved by the Trainer). Resuming from a position reopens
the stream at that chunk, by seeking the sources where their format allows and by re-reading otherwise
(see ``IterableDataset.rows``); nothing before it is mapped or encoded again (a pack stream's packs
are rebuilt up to there). From a sample count alone, a pipeline that keeps every row is placed by
arithmetic; any other is read and transformed from its start up to the count (exact, and warned
about, since it costs a pass over the rows before it). An epoch is one pass of the stream.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from twinkle.dataloader.sampler import BatchPlan
from twinkle.dataset.errors import DataError
from twinkle.log import get_logger

StartMethod = Literal["fork", "spawn", "forkserver"]


@dataclass(frozen=True)
class StreamPosition:
    """Where a stream's next row is: raw chunk ``chunk`` of ``epoch``, after ``offset`` of its output rows."""

    epoch: int
    chunk: int
    offset: int

    def as_list(self) -> list[int]:
        return [self.epoch, self.chunk, self.offset]

    @classmethod
    def parse(cls, value: Any) -> StreamPosition:
        """A position from ``[epoch, chunk, offset]`` (what ``as_list`` gives), refused naming the value."""
        if isinstance(value, StreamPosition):
            return value
        if not (isinstance(value, (list, tuple)) and len(value) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
            raise DataError(f"stream_position must be [epoch, chunk, offset], three non-negative integers (what "
                            f"DataLoader.get_state()['stream_position'] gives), got {str(value)[:60]!r}.")
        return cls(*value)


#: one transformed chunk: (chunk, global rows when the chunk is one batch (else None), rows)
Chunk = tuple[int, int | None, list[dict[str, Any]]]


class StreamBatches:
    """One rank's view of a stream: its raw chunks, their transform, and the full batches cut from them."""

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

    @property
    def keeps_rows(self) -> bool:
        """Whether every raw row gives exactly one row (then batch k is chunk k)."""
        return bool(getattr(self.dataset, "keeps_every_row", False))

    def plan(self) -> BatchPlan:
        """The epoch's batch layout of a pipeline that keeps every row (counts the stream once, then kept)."""
        if self._num_rows is None:
            self._num_rows = self.dataset.num_rows()
        return BatchPlan(num_rows=self._num_rows, batch_size=self.batch_size, min_batch_size=self.min_batch_size,
                         data_world_size=self.data_world_size, shuffle=False, seed=self.seed)

    def _raw_chunks(self, epoch: int, first_chunk: int) -> Iterator[tuple[int, list[tuple[str, Any]]]]:
        B = self.batch_size
        rows = self.dataset.rows(epoch=epoch, start=first_chunk * B, shuffle_buffer=self.shuffle_buffer,
                                 seed=self.seed)
        chunk, raw = first_chunk, []
        for item in rows:
            raw.append(item)
            if len(raw) == B:
                yield chunk, raw
                chunk, raw = chunk + 1, []
        if raw:
            yield chunk, raw

    def chunks(self, epoch: int, first_chunk: int, whole: bool, worker: int = 0, num_workers: int = 1
               ) -> Iterator[Chunk]:
        """The transformed chunks of the epoch from ``first_chunk``; worker ``w`` of ``W`` does every W-th.

        ``whole``: transform every row of a chunk; else (a pipeline that keeps every row) only this rank's
        rows of it, cut as the batch it is (the epoch's final partial one to a multiple of the data-parallel
        size, kept when that leaves at least ``min_batch_size`` rows, as in :class:`BatchPlan`).
        """
        R, B = self.data_world_size, self.batch_size
        for j, (chunk, raw) in enumerate(self._raw_chunks(epoch, first_chunk)):
            if j % num_workers != worker:
                continue
            first = chunk * B
            if whole:
                yield chunk, None, self.dataset.transform([r for _, r in raw], [k for k, _ in raw],
                                                          list(range(first, first + len(raw))))
                continue
            size = len(raw) - len(raw) % R
            if size < self.min_batch_size:  # min_batch_size >= 1: an empty cut is dropped too
                continue
            mine = raw[:size][self.data_rank::R]
            yield chunk, size, self.dataset.transform(
                [r for _, r in mine], [k for k, _ in mine], list(range(first + self.data_rank, first + size, R)))

    def batches(self, start: StreamPosition, chunks: Iterator[Chunk]
                ) -> Iterator[tuple[int, list[dict[str, Any]], StreamPosition]]:
        """``(global rows, this rank's rows, the position after)`` of the epoch from ``start``."""
        B, R, r = self.batch_size, self.data_world_size, self.data_rank
        pending: list[tuple[dict[str, Any], int, int]] = []  # (row, chunk, its place among the chunk's rows)
        for chunk, size, rows in chunks:
            if size is not None:
                yield size, rows, StreamPosition(start.epoch, chunk + 1, 0)
                continue
            skip = start.offset if chunk == start.chunk else 0
            pending += [(row, chunk, k) for k, row in enumerate(rows) if k >= skip]
            while len(pending) >= B:
                batch, pending = pending[:B], pending[B:]
                _, last_chunk, last = batch[-1]
                yield B, [row for row, _, _ in batch[r::R]], StreamPosition(start.epoch, last_chunk, last + 1)
        kept = len(pending) - len(pending) % R
        if kept and kept >= self.min_batch_size:
            yield kept, [row for row, _, _ in pending[:kept][r::R]], StreamPosition(start.epoch + 1, 0, 0)


class WorkerStream:
    """What each DataLoader worker runs: its share of the epoch's transformed chunks."""

    def __init__(self, batches: StreamBatches, epoch: int, first_chunk: int, whole: bool) -> None:
        self.batches = batches
        self.epoch = epoch
        self.first_chunk = first_chunk
        self.whole = whole

    def __iter__(self) -> Iterator[Chunk]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.batches.chunks(self.epoch, self.first_chunk, self.whole, worker, workers)


def _as_is(item: Any) -> Any:
    return item


def transformed_chunks(batches: StreamBatches, start: StreamPosition, whole: bool, num_workers: int,
                       start_method: StartMethod | None) -> Iterator[Chunk]:
    """The epoch's transformed chunks from ``start``, in worker processes if asked."""
    if num_workers == 0:
        yield from batches.chunks(start.epoch, start.chunk, whole)
        return
    import multiprocessing

    import torch.utils.data

    from twinkle.dataloader.torch_stream import TorchStream

    source = TorchStream(WorkerStream(batches, start.epoch, start.chunk, whole))
    method = start_method or multiprocessing.get_start_method()
    if method != "fork":
        check_picklable(source, method)
    yield from torch.utils.data.DataLoader(source, batch_size=None, num_workers=num_workers, collate_fn=_as_is,
                                           multiprocessing_context=start_method)


def check_picklable(source: Any, method: str) -> None:
    """Refuse, naming the cause and the fix, a stream the ``spawn``/``forkserver`` workers cannot receive."""
    try:
        pickle.dumps(source)
    except Exception as exc:
        raise DataError(
            f"num_workers with the {method!r} start method sends the dataset to each worker by pickling, and it "
            f"cannot be pickled ({type(exc).__name__}: {exc}). Give map/filter functions defined at module level "
            "(not lambdas or functions defined inside another), or use multiprocessing_context='fork' (Linux), or "
            "num_workers=0.") from exc


class StreamLoader:
    """The DataLoader's side of a stream: its position, an open iterator kept between ``for`` loops, resume.

    The Trainer re-enters the loader every step; reopening the stream each time would re-read it,
    so the open iterator is kept and continued while the loader's sample count is where it left off.
    """

    def __init__(self, batches: StreamBatches, num_workers: int, start_method: StartMethod | None = None) -> None:
        self.plan = batches
        self.num_workers = num_workers
        self.start_method = start_method
        self._known: tuple[int, StreamPosition | _Tentative] = (0, StreamPosition(0, 0, 0))  # (consumed, position)
        self._live: tuple[int, Any, StreamPosition, Iterator[Any]] | None = None  # consumed, processor, start, it

    # -------------------------------------------------------------- positions
    def resume(self, consumed: int, position: Any = None) -> None:
        """Set the position after ``consumed`` global rows (validated first; nothing changes on an error)."""
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise DataError(f"consumed_train_samples must be a non-negative integer, got {consumed!r}.")
        if position is not None:
            placed = StreamPosition.parse(position)
        elif consumed == self._known[0]:
            placed = self._known[1]
        elif self.plan.keeps_rows and consumed % self.plan.batch_size == 0 and self.plan._num_rows is None:
            # taken as a place in the first epoch, without counting the stream, until it is read from there
            placed = _Tentative(StreamPosition(0, consumed // self.plan.batch_size, 0))
        else:
            placed = self._place(consumed)
        self._live = None
        self._known = (consumed, placed)

    def position(self, consumed: int) -> StreamPosition:
        """The position after ``consumed`` rows (placing it first if it was only tentative)."""
        known = self._known[1]
        if consumed != self._known[0] or isinstance(known, _Tentative):
            known = self._place(consumed)
            self._known = (consumed, known)
        return known

    def epoch_at(self, consumed: int) -> int:
        return self.position(consumed).epoch

    def _place(self, consumed: int) -> StreamPosition:
        if self.plan.keeps_rows:
            epoch, batch = self.plan.plan().position(consumed)
            return StreamPosition(epoch, batch, 0)
        return self._rebuild(consumed)

    def _rebuild(self, consumed: int) -> StreamPosition:
        """Read and transform the stream from its start up to ``consumed`` rows (steps may drop or split rows)."""
        get_logger("twinkle.dataloader").warning(
            "resuming a stream whose steps may drop or split rows from a sample count alone: reading and "
            "transforming it from the start up to sample %d. Pass stream_position too (DataLoader.get_state() "
            "gives it; the Trainer saves it) to skip this.", consumed)
        seen, epoch = 0, 0
        while True:
            start = StreamPosition(epoch, 0, 0)
            given, reached = False, None
            if seen == consumed:
                return start
            for size, _, after in self.plan.batches(start, self.plan.chunks(epoch, 0, whole=True)):
                if reached is not None:
                    return reached  # a batch follows in this epoch
                seen, given = seen + size, True
                if seen == consumed:
                    reached = after  # unless it was the epoch's last batch: then the next epoch's start
                elif seen > consumed:
                    raise DataError(f"consumed_train_samples={consumed} does not fall on a batch boundary of this "
                                    f"stream (batches of {self.plan.batch_size} rows). Resume with the batch_size, "
                                    "min_batch_size and data of the run that saved the checkpoint.")
            if reached is not None:
                return StreamPosition(epoch + 1, 0, 0)
            if not given:
                raise DataError(f"the stream gives no batch of batch_size={self.plan.batch_size}, so no run could "
                                f"have consumed {consumed} samples of it.")
            epoch += 1

    def batches_per_epoch(self) -> int:
        """Global batches in one pass (a pipeline that may drop rows is read and transformed once to count)."""
        if self.plan.keeps_rows:
            return self.plan.plan().batches_per_epoch
        get_logger("twinkle.dataloader").info("counting the stream's batches per epoch: one pass of map + encode")
        return sum(1 for _ in self.plan.batches(StreamPosition(0, 0, 0), self.plan.chunks(0, 0, whole=True)))

    # ----------------------------------------------------------------- reading
    def _open(self, start: StreamPosition, processor: Any) -> Iterator[tuple[int, Any, StreamPosition]]:
        whole = not (self.plan.keeps_rows and start.offset == 0)
        chunks = transformed_chunks(self.plan, start, whole, self.num_workers, self.start_method)
        for size, rows, after in self.plan.batches(start, chunks):
            yield size, (processor(rows) if processor is not None else rows), after

    def batches(self, consumed: int, processor: Any) -> Iterator[tuple[int, Any]]:
        """``(global rows, this rank's batch)`` for the rest of the epoch the position after ``consumed`` is in."""
        opened = not (self._live is not None and self._live[0] == consumed and self._live[1] is processor)
        if not opened:
            _, _, start, it = self._live
        else:
            known = self._known[1] if consumed == self._known[0] else self.position(consumed)
            start = known.position if isinstance(known, _Tentative) else known
            it = self._open(start, processor)
            if isinstance(known, _Tentative):
                # a boundary count taken as a place in the first epoch: if the stream ends right there, the count
                # was in a later epoch, which only the stream's length can place
                head = next(it, None)
                if head is None:
                    start = self.position(consumed)
                    it = self._open(start, processor)
                else:
                    it = _chain(head, it)
            self._known = (consumed, start)
        position, yielded = consumed, False
        for size, batch, after in it:
            position += size
            yielded = True
            self._known = (position, after)
            self._live = (position, processor, start, it)
            yield size, batch
        self._live = None
        self._known = (position, StreamPosition(start.epoch + 1, 0, 0))
        if opened and not yielded and start.chunk == 0 and start.offset == 0:
            raise DataError(f"epoch {start.epoch} of the stream gave no batch of batch_size={self.plan.batch_size} "
                            f"(min_batch_size={self.plan.min_batch_size}); use more rows or a smaller batch_size.")


@dataclass(frozen=True)
class _Tentative:
    """A sample count on a batch boundary taken as a place in the first epoch until the stream is read."""

    position: StreamPosition


def _chain(head: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield head
    yield from rest
