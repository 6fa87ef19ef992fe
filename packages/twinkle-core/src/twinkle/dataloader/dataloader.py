"""DataLoader: global batches, this rank's slice of each, and an exact resume point.

Each data-parallel rank (``DeviceMesh.data_rank``: dp x fsdp) gets a disjoint equal slice of
every global batch; ranks that differ only in tp/pp/cp read the same slice. One ``for`` loop is
one epoch; the next loop continues with the next epoch. Progress is counted in global samples
(``get_state()``), which is what a checkpoint stores and ``resume_from_checkpoint`` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from twinkle.dataloader.sampler import BatchPlan
from twinkle.dataloader.stream import StartMethod, StreamBatches, StreamLoader
from twinkle.dataset.errors import DataError
from twinkle.mesh import DeviceMesh
from twinkle.registry import resolve


class DataLoader:
    """Iterate a dataset in global batches of ``batch_size``; yield this rank's rows.

    Yields a list of row dicts, or, with a ``processor`` (InputProcessor instance, class or
    registered name), the collated tensor dict. ``min_batch_size`` (default ``batch_size``: drop
    the last partial batch) keeps a smaller final batch; see :class:`BatchPlan`. ``shuffle``
    orders each epoch by a permutation seeded with (``seed``, epoch); ``seed`` defaults to the
    one given to ``twinkle.initialize`` or 42. ``device_mesh``/``rank`` default to the runtime's;
    ``rank`` (a global rank) lets tests simulate any rank in one process.

    Over an :class:`~twinkle.dataset.IterableDataset` (see :mod:`twinkle.dataloader.stream`):
    ``shuffle`` is a shuffle buffer of ``shuffle_buffer`` rows seeded with (``seed``, epoch), and
    ``num_workers`` worker processes map and encode the batches, started with
    ``multiprocessing_context`` (torch's default when None: ``fork`` on Linux; ``spawn`` and
    ``forkserver`` need a picklable dataset, checked before a worker starts); ``len()`` is not
    known. Batches stay full when a step drops rows (the next rows fill them).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        min_batch_size: int | None = None,
        device_mesh: DeviceMesh | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        processor: Any = None,
        *,
        rank: int | None = None,
        shuffle_buffer: int = 1000,
        num_workers: int = 0,
        multiprocessing_context: StartMethod | None = None,
    ) -> None:
        from twinkle.runtime import get_runtime

        if callable(dataset) and not hasattr(dataset, "__len__"):
            dataset = dataset()  # a factory, e.g. to build the dataset where the loader lives
        stream = getattr(dataset, "is_stream", False)
        if not stream and (not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__")):
            raise TypeError(
                f"DataLoader needs a Dataset (or anything with len() and []) or an IterableDataset, got "
                f"{type(dataset).__name__}."
            )
        for name, value in (("shuffle_buffer", shuffle_buffer), ("num_workers", num_workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DataError(f"{name} must be a non-negative integer, got {value!r}.")
        if multiprocessing_context not in (None, "fork", "spawn", "forkserver"):
            raise DataError(f"multiprocessing_context must be 'fork', 'spawn', 'forkserver' or None (torch's default), "
                            f"got {multiprocessing_context!r}.")
        if num_workers and not stream:
            raise DataError("num_workers applies to an IterableDataset; a map-style Dataset is read in-process "
                            "(use LazyDataset or encode(num_proc=...) to spread its work).")
        runtime = get_runtime()
        self.dataset = dataset
        # A Ray driver reads whole global batches; its remote model slices them per rank (slice_dp).
        driver = runtime.mode == "ray" and rank is None
        self.device_mesh = device_mesh or (DeviceMesh() if driver else runtime.device_mesh)
        self.rank = runtime.rank if rank is None else rank
        self.data_rank = self.device_mesh.data_rank(self.rank)
        seed = (runtime.seed if runtime.seed is not None else 42) if seed is None else seed
        min_batch_size = batch_size if min_batch_size is None else min_batch_size
        self.stream: StreamLoader | None = None
        if stream:
            # validates batch_size / min_batch_size / seed as for a map-style dataset
            BatchPlan(num_rows=batch_size, batch_size=batch_size, min_batch_size=min_batch_size,
                      data_world_size=self.device_mesh.data_world_size, shuffle=shuffle, seed=seed)
            self.stream = StreamLoader(StreamBatches(
                dataset, batch_size, min_batch_size, self.data_rank, self.device_mesh.data_world_size,
                shuffle_buffer if shuffle else 0, seed), num_workers, multiprocessing_context)
            self._batch_size = batch_size
        else:
            if len(dataset) == 0:
                raise DataError("DataLoader got an empty dataset (0 rows).")
            self.plan = BatchPlan(
                num_rows=len(dataset), batch_size=batch_size, min_batch_size=min_batch_size,
                data_world_size=self.device_mesh.data_world_size, shuffle=shuffle, seed=seed,
            )
            self._batch_size = self.plan.batch_size
        self.processor: Callable[[list[dict[str, Any]]], Any] | None = None
        if processor is not None:
            self.set_processor(processor)
        self._consumed = 0
        self._order: tuple[int, Sequence[int]] | None = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def set_processor(self, processor_cls: Any, **kwargs: Any) -> None:
        """Collate each rank's rows with an InputProcessor (instance, class or registered name)."""
        processor = resolve("processor", processor_cls)
        if isinstance(processor, type):
            processor = processor(**kwargs)
        elif kwargs:
            raise ValueError("set_processor got a processor instance and settings; set them on the instance instead.")
        if not callable(processor):
            raise TypeError(f"{type(processor).__name__} is not callable; a processor maps a list of rows to a batch.")
        self.processor = processor

    def __len__(self) -> int:
        """Global batches per epoch."""
        if self.stream is not None:
            raise TypeError("A DataLoader over an IterableDataset has no length: the stream's is known only once "
                            "it has been read.")
        return self.plan.batches_per_epoch

    def batches_per_epoch(self) -> int:
        """Global batches in one epoch; over a stream it is counted (see ``StreamLoader.batches_per_epoch``)."""
        return self.stream.batches_per_epoch() if self.stream is not None else len(self)

    @property
    def epoch(self) -> int:
        if self.stream is not None:
            return self.stream.epoch_at(self._consumed)
        return self._consumed // self.plan.samples_per_epoch

    def __iter__(self) -> Iterator[Any]:
        if self.stream is not None:
            for size, batch in self.stream.batches(self._consumed, self.processor):
                self._consumed += size
                yield batch
            return
        epoch, first = self.plan.position(self._consumed)
        order = self._epoch_order(epoch)
        for batch in range(first, self.plan.batches_per_epoch):
            rows = self.plan.global_batch(order, batch)
            mine = self._fetch(self.plan.rank_slice(rows, self.data_rank))
            self._consumed += len(rows)
            yield self.processor(mine) if self.processor is not None else mine

    def _epoch_order(self, epoch: int) -> Sequence[int]:
        """The epoch's row order, computed once per epoch: the Trainer re-enters the loader every step."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.plan.order(epoch))
        return self._order[1]

    def _fetch(self, indices: list[int]) -> list[dict[str, Any]]:
        if hasattr(self.dataset, "get_rows"):
            return self.dataset.get_rows(indices)
        return [self.dataset[i] for i in indices]

    def get_state(self) -> dict[str, Any]:
        """``{'consumed_train_samples': n}``: global samples handed out so far, across epochs.

        Over a stream also ``'stream_position'``: ``[epoch, chunk, offset]`` of the next row, which
        :meth:`resume_from_checkpoint` takes to reopen the stream there without reading what came before.
        """
        state: dict[str, Any] = {"consumed_train_samples": self._consumed}
        if self.stream is not None:
            state["stream_position"] = self.stream.position(self._consumed).as_list()
        return state

    def resume_from_checkpoint(self, consumed_train_samples: int, stream_position: Sequence[int] | None = None
                               ) -> None:
        """Continue after ``consumed_train_samples`` global samples, exactly where that run was.

        Args:
            consumed_train_samples: global samples the run had handed out (``get_state()``).
            stream_position: over a stream, ``get_state()['stream_position']`` of that run; without it a
                stream whose steps may drop or split rows is read and transformed up to the count.
        """
        if self.stream is not None:
            self.stream.resume(consumed_train_samples, stream_position)  # validates before changing anything
        else:
            if stream_position is not None:
                raise DataError("stream_position applies to a DataLoader over an IterableDataset; this one reads a "
                                "map-style dataset, placed by consumed_train_samples alone.")
            self.plan.position(consumed_train_samples)  # validates before changing anything
        self._consumed = consumed_train_samples

    def __repr__(self) -> str:
        batches = "stream" if self.stream is not None else len(self)
        return (f"DataLoader(batch_size={self.batch_size}, batches={batches}, data_rank={self.data_rank}/"
                f"{self.device_mesh.data_world_size}, consumed={self._consumed})")
