"""IterableDataset: rows streamed from their files, transformed on the fly, never all in memory.

``map`` / ``filter`` / ``set_template`` / ``encode`` are the calls of :class:`Dataset`; here they are
recorded (:mod:`twinkle.dataset.steps`) and applied to each batch of rows as it is handed out. The
order of the rows (sources mixed by weight, a seeded shuffle buffer) is computed by
:mod:`twinkle.dataset.stream_order`; :class:`~twinkle.dataloader.DataLoader` cuts it into global
batches, gives each data-parallel rank its slice, and resumes it exactly from a sample count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from twinkle.dataset.dataset import _instantiate, build_template
from twinkle.dataset.errors import DataError
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.save import save_rows
from twinkle.dataset.steps import DropLog, Step, apply_steps, map_step
from twinkle.dataset.stream_order import MixChoices, StoppingStrategy, mix, shuffled
from twinkle.dataset.stream_sources import count_rows, iter_source
from twinkle.registry import resolve

if TYPE_CHECKING:
    from twinkle.template import Template

#: rows transformed together when the dataset is iterated directly
ITER_CHUNK = 64


class NoLength(TypeError, NotImplementedError):
    """A stream has no length (a TypeError, so ``list(stream)`` works; NotImplementedError for upstream code)."""


class IterableDataset:
    """Rows of one or more sources, read in order as they are needed. See docs/data.md, "Streaming".

    Iterating it yields the transformed rows of one pass (``next(dataset)`` gives the next one);
    ``len()`` raises :class:`NoLength`. A ``DataLoader`` over it shards the stream over
    data-parallel ranks and workers and resumes exactly (``shuffle`` there means the shuffle buffer).
    """

    is_stream = True

    def __init__(self, dataset_meta: DatasetMeta | str | None = None, **load_kwargs: Any) -> None:
        self._metas: dict[str, DatasetMeta] = {}
        self._load_kwargs = load_kwargs
        self._mix: dict[str, Any] = {"interleave": False, "weights": None, "seed": 42,
                                     "stopping_strategy": "first_exhausted"}
        self._steps: list[Step] = []
        self._lengths: list[int] | None = None
        self.template: Template | None = None
        self.drops = DropLog()
        self._iter: Iterator[dict[str, Any]] | None = None
        if dataset_meta is not None:
            self.add_dataset(dataset_meta)

    # ------------------------------------------------------------- sources
    def add_dataset(self, dataset_meta: DatasetMeta | str, **load_kwargs: Any) -> IterableDataset:
        """Add a source; nothing is read yet (its first rows are, to check it opens)."""
        meta = DatasetMeta(dataset_meta) if isinstance(dataset_meta, str) else dataset_meta
        if not isinstance(meta, DatasetMeta):
            raise TypeError(f"add_dataset expects a DatasetMeta (or an id string), got {type(meta).__name__}.")
        key = meta.get_id()
        if key in self._metas:
            raise DataError(f"{meta.describe()} (subset {meta.subset_name!r}, split {meta.split!r}) was already added.")
        if load_kwargs:
            self._load_kwargs = {**self._load_kwargs, **load_kwargs}
        next(iter_source(meta, 0, **self._load_kwargs), None)  # a missing or unreadable source fails here
        self._metas[key] = meta
        self._lengths = None
        return self

    def mix_dataset(self, interleave: bool = True, weights: Sequence[float] | None = None, seed: int = 42,
                    stopping_strategy: StoppingStrategy = "first_exhausted") -> IterableDataset:
        """Interleave the sources (the default, as upstream Twinkle's): round robin, or drawn with ``weights``;
        ``interleave=False`` concatenates them (as without a call).

        The draws are seeded by ``seed`` (the same every epoch); ``stopping_strategy`` is that of
        ``datasets.interleave_datasets``.
        """
        if weights is not None:
            weights = [float(w) for w in weights]
            if len(weights) != len(self._metas):
                raise DataError(f"mix_dataset got {len(weights)} weights for {len(self._metas)} sources.")
            if any(w < 0 for w in weights) or sum(weights) <= 0:
                raise DataError(f"mix_dataset weights must be >= 0 with a positive sum, got {weights}.")
            if not interleave:
                raise DataError("weights only apply when interleave=True; concatenation takes every row once.")
        if stopping_strategy not in ("first_exhausted", "all_exhausted"):
            raise DataError(f"stopping_strategy={stopping_strategy!r}; choose 'first_exhausted' or 'all_exhausted'.")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed!r}.")
        self._mix = {"interleave": bool(interleave), "weights": weights, "seed": seed,
                     "stopping_strategy": stopping_strategy}
        return self

    @property
    def dataset(self) -> IterableDataset:
        """The combined stream (upstream Twinkle's name): this dataset itself; ``len()`` of it raises."""
        return self

    @property
    def datasets(self) -> dict[str, DatasetMeta]:
        """The sources, by id (their :class:`DatasetMeta`: a stream holds no table to give)."""
        return dict(self._metas)

    # ---------------------------------------------------------- transforms
    def map(self, preprocessor: Any, dataset_meta: DatasetMeta | None = None, *,
            init_args: dict[str, Any] | None = None, strict: bool = True, batched: bool | None = None,
            remove_columns: Sequence[str] = (), **_: Any) -> IterableDataset:
        """Record a map (same arguments as :meth:`Dataset.map`); applied to rows as they stream.

        A function with ``batched=None`` is probed on the source's first rows now.
        """
        proc = _instantiate(resolve("preprocessor", preprocessor), init_args or {}, "preprocessor")
        if not callable(proc):
            raise TypeError(f"map() needs a callable preprocessor, got {type(proc).__name__}.")
        source = self._key(dataset_meta)
        probe = [] if hasattr(proc, "output_features") or batched is not None else self._head(source)
        self._steps.append(map_step(proc, batched, probe, source=source, strict=strict,
                                    remove_columns=remove_columns))
        return self

    def filter(self, fn: Any, dataset_meta: DatasetMeta | None = None, **_: Any) -> IterableDataset:
        """Record a filter ``fn(row) -> bool``."""
        if not callable(fn):
            raise TypeError(f"filter() needs a callable fn(row) -> bool, got {type(fn).__name__}.")
        self._steps.append(Step("filter", fn, self._key(dataset_meta)))
        return self

    def set_template(self, template_cls: Any, model_id: str | None = None, max_length: int | None = None,
                     truncation_strategy: str | None = "raise", **kwargs: Any) -> Template:
        """As :meth:`Dataset.set_template`."""
        self.template = build_template(template_cls, model_id, max_length, truncation_strategy, **kwargs)
        return self.template

    def encode(self, **_: Any) -> IterableDataset:
        """Record tokenization with the template (rows are encoded as they stream)."""
        if self.template is None:
            raise DataError("encode() needs a template: call dataset.set_template('Qwen3Template', model_id=...) "
                            "first.")
        _ = self.template.tokenizer  # load it now (and in the parent, before DataLoader workers fork)
        if any(s.kind == "encode" for s in self._steps):
            raise DataError("encode() was already called on this stream.")
        self._steps.append(Step("encode", self.template))
        return self

    def _key(self, dataset_meta: DatasetMeta | None) -> str | None:
        if not self._metas:
            raise DataError("This IterableDataset has no source; pass IterableDataset(DatasetMeta(...)).")
        if dataset_meta is None:
            return None
        key = dataset_meta.get_id()
        if key not in self._metas:
            raise DataError(f"{dataset_meta.describe()} is not a source of this dataset; sources: "
                            f"{[m.describe() for m in self._metas.values()]}.")
        return key

    def _head(self, source: str | None, n: int = 3) -> list[dict[str, Any]]:
        """The first rows of a source as the steps recorded so far leave them (to probe a function)."""
        key = source or next(iter(self._metas))
        rows = [row for _, row in zip(range(n), iter_source(self._metas[key], 0, **self._load_kwargs))]
        return apply_steps(self._steps, rows, list(range(len(rows))), [key] * len(rows))

    # ------------------------------------------------------------ reading
    @property
    def drop_counts(self) -> dict[str, int]:
        """Rows dropped by the steps so far in this process, per step and reason."""
        return dict(self.drops.counts)

    def rows(self, epoch: int = 0, start: int = 0, shuffle_buffer: int = 0, seed: int = 42
             ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(source key, raw row)`` of the stream's order from position ``start`` of ``epoch``.

        Without a shuffle buffer a start position is reached by seeking the sources (see
        :mod:`twinkle.dataset.stream_sources`); with one, by reading (not transforming) the rows before
        it, since the buffer's content there depends on them.
        """
        if not self._metas:
            raise DataError("This IterableDataset has no source; pass IterableDataset(DatasetMeta(...)).")
        if shuffle_buffer > 1:
            stream = shuffled(self._mixed(0), shuffle_buffer, [seed, epoch])
            for _ in range(start):
                if next(stream, None) is None:
                    return iter(())
            return stream
        return self._mixed(start)

    def _mixed(self, start: int) -> Iterator[tuple[str, dict[str, Any]]]:
        keys = list(self._metas)
        if len(keys) == 1 or not self._mix["interleave"]:
            return self._concatenated(keys, start)
        choices = MixChoices(len(keys), self._mix["weights"], self._mix["seed"])
        stream = mix(lambda k, pos: iter_source(self._metas[keys[k]], pos, **self._load_kwargs), choices, start,
                     self._mix["stopping_strategy"], self._source_lengths)
        return ((keys[k], row) for k, row in stream)

    def _concatenated(self, keys: list[str], start: int) -> Iterator[tuple[str, dict[str, Any]]]:
        sizes = self._source_lengths() if start and len(keys) > 1 else None
        for n, key in enumerate(keys):
            if sizes is not None and start >= sizes[n]:
                start -= sizes[n]
                continue
            yield from ((key, row) for row in iter_source(self._metas[key], start, **self._load_kwargs))
            start = 0

    def _source_lengths(self) -> list[int]:
        """Rows per source, counted once (from metadata for parquet/arrow/lance, by parsing for text files)."""
        if self._lengths is None:
            self._lengths = [count_rows(m, **self._load_kwargs) for m in self._metas.values()]
        return self._lengths

    def num_rows(self) -> int:
        """Rows in one pass of the stream (after mixing, before any step drops rows)."""
        if len(self._metas) == 1 or not self._mix["interleave"]:
            return sum(self._source_lengths())
        return sum(1 for _ in self._mixed(0))

    def transform(self, rows: list[dict[str, Any]], sources: Sequence[str | None], indices: list[int]
                  ) -> list[dict[str, Any]]:
        """Apply the recorded steps to rows at stream positions ``indices`` (what a DataLoader calls)."""
        return apply_steps(self._steps, rows, indices, sources, self.drops)

    @property
    def keeps_every_row(self) -> bool:
        """Whether each row surely gives one row: no step that may drop or split rows (filter, preprocessor,
        batched function, encode), so a DataLoader places a sample count by arithmetic."""
        return all(step.kind == "row" for step in self._steps)

    def __getstate__(self) -> dict[str, Any]:
        # sent to spawn/forkserver DataLoader workers: an open iteration is not part of the dataset
        return {**self.__dict__, "_iter": None}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        chunk: list[tuple[str, dict[str, Any]]] = []
        position = 0
        for item in self.rows():
            chunk.append(item)
            if len(chunk) == ITER_CHUNK:
                yield from self.transform([r for _, r in chunk], [k for k, _ in chunk],
                                          list(range(position, position + len(chunk))))
                position += len(chunk)
                chunk = []
        if chunk:
            yield from self.transform([r for _, r in chunk], [k for k, _ in chunk],
                                      list(range(position, position + len(chunk))))

    def __next__(self) -> dict[str, Any]:
        if self._iter is None:
            self._iter = iter(self)
        return next(self._iter)

    def __len__(self) -> int:
        raise NoLength("An IterableDataset has no length: it is read as a stream. Iterate it, or use Dataset / "
                       "LazyDataset for random access.")

    def save_as(self, output_path: str, format: str | None = None, batch_size: int = 1000) -> str:
        """Write the transformed rows of one pass to ``output_path`` (see :func:`~twinkle.dataset.save.save_rows`)."""
        return save_rows(iter(self), output_path, format, batch_size)

    def __repr__(self) -> str:
        sources = ", ".join(m.describe() for m in self._metas.values()) or "no source"
        return f"IterableDataset({sources}; steps={[s.kind for s in self._steps]}; template={self.template!r})"
