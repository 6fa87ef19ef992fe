"""Turn a DatasetMeta into an HF ``datasets.Dataset`` (Arrow-backed), then apply its ``data_slice``."""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from twinkle.dataset.diagnose import diagnose_file, loaded_problem, type_mismatch
from twinkle.dataset.errors import DataError, preview
from twinkle.dataset.meta import DatasetMeta
from twinkle.hub import resolve_path

if TYPE_CHECKING:
    import datasets

#: file suffix -> (datasets builder, extra builder kwargs); empty CSV cells stay empty strings, not None
FILE_BUILDERS: dict[str, tuple[str, dict[str, Any]]] = {
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".csv": ("csv", {"na_filter": False}),
    ".tsv": ("csv", {"delimiter": "\t", "na_filter": False}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
    ".arrow": ("arrow", {}),
}


def load_source(meta: DatasetMeta, **load_kwargs: Any) -> datasets.Dataset:
    """The rows of ``meta`` as a ``datasets.Dataset``; ``load_kwargs`` go to ``datasets.load_dataset``."""
    if meta.data is not None:
        dataset = _from_memory(meta.rows())
    else:
        path = resolve_path(meta.dataset_id, repo_type="dataset")
        dataset = _from_file(path, **load_kwargs) if os.path.isfile(path) else _from_dir(path, meta, **load_kwargs)
    return apply_slice(dataset, meta)


def _from_memory(data: Any) -> datasets.Dataset:
    import datasets
    import pyarrow as pa

    try:
        if isinstance(data, Mapping):
            return datasets.Dataset.from_dict(dict(data))
        rows = list(data)
        if not rows:
            raise DataError("DatasetMeta.data is empty; give at least one row.")
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise DataError(f"DatasetMeta.data row {i} is a {type(row).__name__}, not a dict: {preview(row)}.")
        mismatch = type_mismatch((f"row {i}", r) for i, r in enumerate(rows))
        if mismatch:
            raise DataError(f"DatasetMeta.data {mismatch}")
        # every column any row has (from_list would keep only the first row's: a text-only first row
        # would silently drop the images of the rows after it)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        return datasets.Dataset.from_list([{c: r.get(c) for c in columns} for r in rows])
    except (pa.ArrowException, TypeError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(
            f"Could not build a table from DatasetMeta.data: {type(exc).__name__}: {exc}. "
            "Every row must use the same type for a given column (e.g. 'query' always a string)."
        ) from exc


def _from_file(path: str, **load_kwargs: Any) -> datasets.Dataset:
    import datasets

    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FILE_BUILDERS:
        raise DataError(
            f"Cannot read {path!r}: unsupported file type {suffix or '(none)'!r}; "
            f"supported: {', '.join(sorted(FILE_BUILDERS))}, or a directory."
        )
    builder, extra = FILE_BUILDERS[suffix]
    where = f"Could not read {path!r} as {builder}"
    if os.path.getsize(path) == 0:
        raise DataError(f"{where}: {diagnose_file(path)}")
    try:
        dataset = datasets.load_dataset(builder, data_files=path, split="train", **extra, **load_kwargs)
    except Exception as exc:
        raise DataError(f"{where}: {diagnose_file(path) or f'{type(exc).__name__}: {_cause(exc)}'}") from exc
    problem = loaded_problem(dataset, json_source=builder == "json")
    if problem:
        raise DataError(f"{where}: {diagnose_file(path) or problem + '; every row needs the same field types, UTF-8'}")
    return dataset


def _from_dir(path: str, meta: DatasetMeta, **load_kwargs: Any) -> datasets.Dataset:
    import datasets

    if os.path.exists(os.path.join(path, "state.json")) or os.path.exists(os.path.join(path, "dataset_dict.json")):
        loaded = datasets.load_from_disk(path)  # written by save_to_disk
        if isinstance(loaded, datasets.DatasetDict):
            if meta.split not in loaded:
                raise DataError(
                    f"{path!r} has splits {sorted(loaded)}, not {meta.split!r}; set DatasetMeta(split=...)."
                )
            loaded = loaded[meta.split]
        return loaded
    name = None if meta.subset_name in (None, "", "default") else meta.subset_name
    try:
        return datasets.load_dataset(path, name=name, split=meta.split, **load_kwargs)
    except Exception as exc:
        raise DataError(
            f"Could not load {meta.describe()} (subset {meta.subset_name!r}, split {meta.split!r}) from {path!r}: "
            f"{type(exc).__name__}: {_cause(exc)}"
        ) from exc


def _cause(exc: BaseException) -> str:
    """The innermost message: datasets wraps parse errors in DatasetGenerationError."""
    while exc.__cause__ is not None and str(exc.__cause__):
        exc = exc.__cause__
    return str(exc)


def apply_slice(dataset: datasets.Dataset, meta: DatasetMeta) -> datasets.Dataset:
    """Select ``meta.data_slice``; every index must name an existing row."""
    if meta.data_slice is None:
        return dataset
    size = len(dataset)
    indices: list[int] = []
    for position, value in enumerate(meta.data_slice):
        try:
            index = operator.index(value)
        except TypeError:
            raise DataError(
                f"data_slice of {meta.describe()} holds {value!r} at position {position}; indices must be integers."
            ) from None
        if not 0 <= index < size:
            raise DataError(
                f"data_slice of {meta.describe()} asks for row {index}, but it has {size} rows "
                f"(indices 0..{size - 1}). "
                f"Ask for at most {size} rows, e.g. data_slice=range({size})."
            )
        indices.append(index)
    return dataset.select(indices)
