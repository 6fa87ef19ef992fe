"""DatasetMeta: where rows come from (hub id, local path, embedded asset or in-memory rows) and which of them."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.dataset.errors import DataError


@dataclass
class DatasetMeta:
    """Describes one data source.

    ``dataset_id``: ``ms://org/name``, ``hf://org/name``, ``twinkle://self-cognition``, or a local file
    (json, jsonl, csv, tsv, parquet, txt, arrow) or directory. ``data``: in-memory rows instead, a list
    of dicts or a dict of columns, or a function returning them (or yielding rows), called on each load.
    ``subset_name``/``split`` pick a hub or directory configuration. ``data_slice``: any iterable of row indices
    (``range(1000)``); an index past the end is an error.
    """

    dataset_id: str | os.PathLike[str] | None = None
    subset_name: str = "default"
    split: str = "train"
    data_slice: Iterable[int] | None = None
    data: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]] | Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if (self.dataset_id is None) == (self.data is None):
            raise DataError(
                "DatasetMeta needs exactly one source: dataset_id='ms://org/name' | 'hf://org/name' | a local path, "
                f"or data=[{{...}}, ...] for in-memory rows (got dataset_id={self.dataset_id!r} and "
                f"data={'given' if self.data is not None else None})."
            )
        if self.dataset_id is not None and not isinstance(self.dataset_id, (str, os.PathLike)):
            raise DataError(f"DatasetMeta.dataset_id must be a string or path, got {type(self.dataset_id).__name__}.")
        if self.data is not None and not callable(self.data) and (
                isinstance(self.data, str) or not isinstance(self.data, (Sequence, Mapping))):
            raise DataError(
                "DatasetMeta.data must be a list of row dicts, a dict of columns or a function returning them, got "
                f"{type(self.data).__name__}."
            )
        if self.data_slice is not None:
            if isinstance(self.data_slice, (str, bytes, Mapping)) or not isinstance(self.data_slice, Iterable):
                raise DataError(
                    f"DatasetMeta.data_slice must be an iterable of row indices such as range(100), "
                    f"got {self.data_slice!r}."
                )
            if not isinstance(self.data_slice, (range, list, tuple)):
                self.data_slice = list(self.data_slice)  # a generator would be used up by the first load

    def rows(self) -> Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]:
        """The in-memory rows (a function's result, its yielded rows as a list); a DataError if none."""
        if self.data is None:
            raise DataError(f"{self.describe()} is not an in-memory source.")
        if not callable(self.data):
            return self.data
        out = self.data()
        return out if isinstance(out, (Sequence, Mapping)) and not isinstance(out, str) else list(out)

    def get_id(self) -> str:
        """A key naming this source among the sources of one Dataset (two slices of one source differ).

        ``'/'`` reads ``'_'`` (upstream Twinkle's spelling: ``'org/name:default:train'`` is
        ``'org_name:default:train'``).
        """
        source = (f"<in-memory rows @{id(self.data):x}>" if self.data is not None
                  else os.fspath(self.dataset_id).replace("/", "_"))
        key = f"{source}:{self.subset_name}:{self.split}"
        if self.data_slice is not None:
            digest = hashlib.sha1(repr(list(self.data_slice)).encode()).hexdigest()[:12]
            key += f":slice-{digest}"
        return key

    def describe(self) -> str:
        return "in-memory rows" if self.data is not None else repr(os.fspath(self.dataset_id))
