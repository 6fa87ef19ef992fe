"""LazyDataset: random access to rows that are mapped and encoded when they are read, then cached.

Loading, ``filter`` and ``mix_dataset`` act on the table at once (a filter must know which rows
remain so that indices are stable); ``map`` and ``encode`` are recorded and applied to the rows a
``__getitem__`` / ``get_rows`` call asks for, through the same callables as :class:`Dataset`, so a
row reads the same either way. Nothing is processed up front, so training starts at once on a
corpus that would take hours to encode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from twinkle.dataset import transforms
from twinkle.dataset.dataset import Dataset, _instantiate
from twinkle.dataset.errors import DataError
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.steps import DropLog, Step, apply_steps, map_step
from twinkle.registry import resolve

SOURCE_COLUMN = "__twinkle_source__"
#: rows read (and transformed) together when the dataset is iterated
ITER_CHUNK = 64


class LazyDataset(Dataset):
    """A :class:`Dataset` whose ``map`` and ``encode`` run on access, for the rows accessed.

    Every step must give one row per row (a batched function that drops or splits rows, a
    filter-like preprocessor returning None, or a row ``encode`` drops, raise a ``DataError`` naming
    the row: filter such rows first). ``cache_size`` transformed rows are kept (least recently used
    first out).
    """

    def __init__(self, dataset_meta: DatasetMeta | str | None = None, cache_size: int = 10_000,
                 **load_kwargs: Any) -> None:
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise DataError(f"cache_size must be a non-negative integer, got {cache_size!r}.")
        self._steps: list[Step] = []
        self._cache: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.cache_size = cache_size
        self.drops = DropLog()
        super().__init__(dataset_meta, **load_kwargs)

    @property
    def do_encode(self) -> bool:
        """Whether ``encode()`` was called (upstream Twinkle's flag)."""
        return any(step.kind == "encode" for step in self._steps)

    def map(self, preprocessor: Any, dataset_meta: DatasetMeta | None = None, *,
            init_args: dict[str, Any] | None = None, strict: bool = True, batched: bool | None = None,
            remove_columns: Sequence[str] = (), **_: Any) -> LazyDataset:
        """Record a map (the arguments of :meth:`Dataset.map`); ``strict=False`` is not available lazily."""
        proc = _instantiate(resolve("preprocessor", preprocessor), init_args or {}, "preprocessor")
        if not callable(proc):
            raise TypeError(f"map() needs a callable preprocessor, got {type(proc).__name__}.")
        if not strict:
            raise DataError("LazyDataset.map cannot skip bad rows (strict=False): indices must stay stable. Filter "
                            "them first, or use Dataset.map.")
        key = self._keys(dataset_meta)[0] if dataset_meta is not None else None
        probe = [] if hasattr(proc, "output_features") or batched is not None else self._probe(key)
        self._steps.append(map_step(proc, batched, probe, source=key, strict=True, remove_columns=remove_columns))
        self._cache.clear()
        if key is not None:
            self._combined = None  # rebuilt with each row's source key
        return self

    def _probe(self, key: str | None) -> list[dict[str, Any]]:
        part = self._parts[key or next(iter(self._parts))]
        rows = transforms.to_rows(part[:3]) if len(part) else []
        return apply_steps(self._steps, rows, list(range(len(rows))), [key] * len(rows))

    def encode(self, **_: Any) -> LazyDataset:
        """Record tokenization with the template; rows are encoded when read."""
        if self.template is None:
            raise DataError("encode() needs a template: call dataset.set_template('Qwen3Template', model_id=...) "
                            "first.")
        if self.do_encode:
            raise DataError("encode() was already called on this LazyDataset.")
        _ = self.template.tokenizer  # load it now, once
        self._steps.append(Step("encode", self.template))
        self._cache.clear()
        return self

    def _replace(self, updated: dict[str, Any]) -> None:
        super()._replace(updated)
        self._cache.clear()

    def _combine(self) -> Any:
        """The raw rows; with several sources each row carries its source's key (for per-source maps)."""
        if len(self._parts) > 1 and any(step.source is not None for step in self._steps):
            original = dict(self._parts)
            try:
                for key, part in original.items():
                    self._parts[key] = part.add_column(SOURCE_COLUMN, [key] * len(part))
                return super()._combine()
            finally:
                self._parts.update(original)
        return super()._combine()

    def get_rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Rows at ``indices`` mapped and encoded (cached ones from the cache)."""
        indices = [int(i) for i in indices]
        size = len(self)
        indices = [i + size if i < 0 else i for i in indices]
        missing = sorted({i for i in indices if i not in self._cache})
        if missing:
            raw = super().get_rows(missing)
            sources = [row.pop(SOURCE_COLUMN, None) for row in raw]
            if len(self._parts) == 1:
                sources = [next(iter(self._parts))] * len(raw)
            out = self._transform(raw, missing, sources)
            for i, row in zip(missing, out):
                self._remember(i, row)
            got = dict(zip(missing, out))
        else:
            got = {}
        result = []
        for i in indices:
            row = got.get(i)
            if row is None:
                row = self._cache[i]
                self._cache.move_to_end(i)
            result.append(row)
        return result

    def _transform(self, rows: list[dict[str, Any]], indices: list[int], sources: list[str | None]
                   ) -> list[dict[str, Any]]:
        return apply_steps(self._steps, rows, indices, sources, self.drops, one_to_one="LazyDataset")

    def _remember(self, index: int, row: dict[str, Any]) -> None:
        if self.cache_size == 0:
            return
        self._cache[index] = row
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.get_rows(range(*index.indices(len(self))))
        if isinstance(index, Sequence) and not isinstance(index, str):
            return self.get_rows(index)
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.get_rows([index])[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), ITER_CHUNK):
            yield from self.get_rows(range(start, min(start + ITER_CHUNK, len(self))))

    def __repr__(self) -> str:
        return f"Lazy{super().__repr__()[:-1]}; steps={[s.kind for s in self._steps]})"
