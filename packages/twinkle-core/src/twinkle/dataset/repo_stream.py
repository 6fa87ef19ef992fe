"""Sources streamed through ``datasets.load_dataset(..., streaming=True)``: hub datasets and dataset repositories.

A hub id is never downloaded whole before a stream starts: ``hf://org/name`` goes to
``datasets.load_dataset("org/name", name=subset, split=split, streaming=True)``, which fetches the
data files a chunk at a time as rows are read; ``ms://org/name`` to ModelScope's
``MsDataset.load(..., use_streaming=True)``, which does the same through ModelScope's hub (an HF
``IterableDataset`` for its general datasets). A local directory laid out as a dataset repository
(it has a ``README.md`` dataset card, as a hub snapshot does) goes through the same call, so its
subsets and splits are the card's, read exactly as the hub would read them.

These streams have no row index: a start row is reached by reading the rows before it
(``IterableDataset.skip``); the row count comes from the card's split sizes when it states them,
else from one pass.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.dataset.meta import DatasetMeta
from twinkle.hub import HF_PREFIX, MS_PREFIX

#: rows fetched per batch from a repository stream
READ_BATCH = 1024
#: the file that makes a local directory a dataset repository
CARD = "README.md"


def is_repo_source(meta: DatasetMeta) -> bool:
    """Whether ``meta`` streams through ``load_dataset``: a hub id, or a local directory with a dataset card."""
    if meta.dataset_id is None:
        return False
    text = os.fspath(meta.dataset_id)
    if text.startswith((HF_PREFIX, MS_PREFIX)):
        return True
    path = os.path.expanduser(text)
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CARD))


def open_stream(meta: DatasetMeta, **load_kwargs: Any) -> Any:
    """The source as an HF ``datasets.IterableDataset`` (or, from ModelScope, any iterable of rows)."""
    text = os.fspath(meta.dataset_id)
    name = None if meta.subset_name in (None, "", "default") else meta.subset_name
    where = f"{meta.describe()} (subset {meta.subset_name!r}, split {meta.split!r})"
    try:
        if text.startswith(MS_PREFIX):
            return _modelscope(text[len(MS_PREFIX):].strip("/"), name, meta.split, **load_kwargs)
        import datasets

        path = text[len(HF_PREFIX):].strip("/") if text.startswith(HF_PREFIX) else os.path.expanduser(text)
        return datasets.load_dataset(path, name=name, split=meta.split, streaming=True, **load_kwargs)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"Could not stream {where}: {type(exc).__name__}: {exc}") from exc


def _modelscope(repo_id: str, name: str | None, split: str, **load_kwargs: Any) -> Any:
    try:
        from modelscope import MsDataset
    except ImportError:
        raise DataError(f"streaming ms://{repo_id} needs the ModelScope client: pip install "
                        "'twinkle-core[modelscope]'.") from None
    return MsDataset.load(repo_id, subset_name=name, split=split, use_streaming=True, **load_kwargs)


def iter_repo(meta: DatasetMeta, start: int, **load_kwargs: Any) -> Iterator[dict[str, Any]]:
    """The rows of a repository source from row ``start`` on."""
    from twinkle.dataset.transforms import to_rows

    stream = open_stream(meta, **load_kwargs)
    if not hasattr(stream, "iter"):  # a ModelScope stream that is not an HF IterableDataset: rows one by one
        yield from itertools.islice(iter(stream), start, None)
        return
    try:
        # .iter(batch_size) rather than iter(): inside a torch DataLoader worker, iter() would shard the
        # stream over the workers itself; twinkle's workers each read the whole stream
        for batch in (stream.skip(start) if start else stream).iter(batch_size=READ_BATCH):
            yield from to_rows(batch)
    except Exception as exc:
        raise DataError(f"Could not stream {meta.describe()}: {type(exc).__name__}: {exc}") from exc


def count_repo(meta: DatasetMeta, **load_kwargs: Any) -> int:
    """Rows of a repository source: the split size its card states, else counted in one pass."""
    stream = open_stream(meta, **load_kwargs)
    splits = getattr(getattr(stream, "info", None), "splits", None) or {}
    split = splits.get(meta.split) if hasattr(splits, "get") else None
    if split is not None and getattr(split, "num_examples", None):
        return int(split.num_examples)
    return sum(1 for _ in iter_repo(meta, 0, **load_kwargs))
