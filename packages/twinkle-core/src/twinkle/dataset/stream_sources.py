"""Read one source's rows one after another, from any row on, in bounded memory.

Parquet, Arrow and Lance files are read with pyarrow / pylance a record batch at a time, and a start
row is reached by seeking: whole row groups / record batches / fragments before it are skipped from
their metadata, never decoded. JSON Lines, JSON, CSV/TSV and text files go through HF ``datasets``
in streaming mode (chunks of the file parsed by pyarrow); these formats have no row index, so a
start row is reached by parsing the rows before it (``IterableDataset.skip``). In-memory rows and
``data_slice`` ranges are sliced directly. Hub ids and local dataset repositories stream through
``datasets.load_dataset`` (:mod:`twinkle.dataset.repo_stream`), never downloaded whole first.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.dataset.loading import FILE_BUILDERS
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.repo_stream import count_repo, is_repo_source, iter_repo
from twinkle.hub import resolve_path

#: rows per record batch read from parquet / arrow / lance
READ_BATCH = 1024
SEEKABLE = (".parquet", ".arrow", ".lance")
#: bytes of a text file parsed at a time (datasets reads 10 MiB, whose parsed table is several times that; a
#: smaller chunk keeps a stream's memory small and independent of the file's size)
STREAM_CHUNKS: dict[str, dict[str, Any]] = {"json": {"chunksize": 1 << 20}, "text": {"chunksize": 1 << 20}}
STREAM_SUFFIXES = (*FILE_BUILDERS, ".lance")


def source_files(meta: DatasetMeta) -> list[str]:
    """The local files (or ``.lance`` dataset directories) of a source, in reading order."""
    path = resolve_path(meta.dataset_id, repo_type="dataset")
    if os.path.isfile(path) or path.rstrip(os.sep).endswith(".lance"):
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(root, d) for d in dirs if d.endswith(".lance")]  # a Lance dataset is a folder
            dirs[:] = [d for d in dirs if not d.endswith(".lance")]
            files += [os.path.join(root, f) for f in names
                      if os.path.splitext(f)[1].lower() in STREAM_SUFFIXES and not f.startswith(".")]
        files.sort()
    if not files:
        raise DataError(f"{meta.describe()} has no data files to stream (looked for {', '.join(STREAM_SUFFIXES)}).")
    suffixes = {os.path.splitext(f)[1].lower() for f in files}
    unsupported = suffixes - set(STREAM_SUFFIXES)
    if unsupported:
        raise DataError(f"Cannot stream {files[0]!r}: unsupported file type {sorted(unsupported)}; supported: "
                        f"{', '.join(STREAM_SUFFIXES)}.")
    if len(suffixes) > 1:
        raise DataError(f"{meta.describe()} mixes file types {sorted(suffixes)}; stream one type per source "
                        "(add the others with add_dataset).")
    return files


def slice_bounds(meta: DatasetMeta) -> tuple[int, int | None]:
    """(first row, end row or None) of ``data_slice``; a stream takes contiguous ranges only."""
    s = meta.data_slice
    if s is None:
        return 0, None
    if isinstance(s, range) and s.step == 1 and s.start >= 0:
        return s.start, s.stop
    raise DataError(f"data_slice of a streamed source must be a contiguous range such as range(1000), got "
                    f"{s!r}; a stream reads rows in order and cannot pick arbitrary ones.")


def iter_source(meta: DatasetMeta, start: int = 0, **load_kwargs: Any) -> Iterator[dict[str, Any]]:
    """The rows of ``meta`` from row ``start`` (after ``data_slice``) on."""
    first, end = slice_bounds(meta)
    begin = first + start
    if end is not None and begin >= end:
        return iter(())
    if meta.data is not None:
        rows = meta.rows()
        if not isinstance(rows, list):
            rows = [dict(zip(rows, values)) for values in zip(*rows.values())] if hasattr(rows, "values") \
                else list(rows)
        return iter(rows[begin:end])
    if is_repo_source(meta):
        rows = iter_repo(meta, begin, **load_kwargs)
    else:
        rows = _iter_files(source_files(meta), begin, **load_kwargs)
    return rows if end is None else itertools.islice(rows, end - begin)


def count_rows(meta: DatasetMeta, **load_kwargs: Any) -> int:
    """Rows of a source (after ``data_slice``): from metadata for parquet/arrow/lance, by parsing text files."""
    first, end = slice_bounds(meta)
    if meta.data is not None:
        rows = meta.rows()
        total = len(rows) if not isinstance(rows, Mapping) else len(next(iter(rows.values()), []))
    elif is_repo_source(meta):
        total = count_repo(meta, **load_kwargs)
    else:
        total = 0
        for path in source_files(meta):
            suffix = os.path.splitext(path)[1].lower()
            total += _num_rows(path, suffix) if suffix in SEEKABLE else _count_hf(path, suffix, **load_kwargs)
    return max(0, (total if end is None else min(total, end)) - first)


def _iter_files(files: list[str], start: int, **load_kwargs: Any) -> Iterator[dict[str, Any]]:
    for path in files:
        suffix = os.path.splitext(path)[1].lower()
        if suffix in SEEKABLE:
            size = _num_rows(path, suffix)
            if start >= size:
                start -= size
                continue
            yield from _iter_seekable(path, suffix, start)
        else:
            given = 0
            for row in _iter_hf(path, suffix, start, **load_kwargs):
                given += 1
                yield row
            if given == 0 and start:  # the start lies past this file: skip its rows
                start -= _count_hf(path, suffix, **load_kwargs)
                start = max(start, 0)
                continue
        start = 0


def _num_rows(path: str, suffix: str) -> int:
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if suffix == ".lance":
        return _lance(path).count_rows()
    return sum(batch.num_rows for batch in _arrow_batches(path))


def _iter_seekable(path: str, suffix: str, start: int) -> Iterator[dict[str, Any]]:
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)
            groups, skip = [], start
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if skip >= n and not groups:
                    skip -= n
                    continue
                groups.append(g)
            batches = pf.iter_batches(batch_size=READ_BATCH, row_groups=groups)
        elif suffix == ".lance":
            batches = _lance(path).to_batches(batch_size=READ_BATCH, offset=start, scan_in_order=True)
            skip = 0
        else:
            batches, skip = _arrow_batches(path), start
        for batch in batches:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield from batch.slice(skip).to_pylist()
            skip = 0
    except (OSError, ValueError) as exc:
        raise DataError(f"Could not stream {path!r}: {type(exc).__name__}: {exc}") from exc


def _arrow_batches(path: str) -> Iterator[Any]:
    """Record batches of an Arrow IPC file or stream (``datasets`` writes the stream format), memory-mapped."""
    import pyarrow as pa

    source = pa.memory_map(path)
    try:
        reader = pa.ipc.open_file(source)
        return (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        source.seek(0)
        return iter(pa.ipc.open_stream(source))


def _lance(path: str) -> Any:
    try:
        import lance
    except ImportError:
        raise DataError(f"{path!r} is a Lance dataset; reading it needs pylance: pip install 'twinkle-core[lance]'."
                        ) from None
    return lance.dataset(path)


def _hf_stream(path: str, suffix: str, **load_kwargs: Any) -> Any:
    import datasets

    builder, extra = FILE_BUILDERS[suffix]
    kwargs = {**STREAM_CHUNKS.get(builder, {}), **extra, **load_kwargs}
    return datasets.load_dataset(builder, data_files=path, split="train", streaming=True, **kwargs)


def _iter_hf(path: str, suffix: str, start: int, **load_kwargs: Any) -> Iterator[dict[str, Any]]:
    from twinkle.dataset.diagnose import diagnose_file

    if os.path.getsize(path) == 0:
        raise DataError(f"Could not stream {path!r}: {diagnose_file(path)}")
    from twinkle.dataset.transforms import to_rows

    stream = _hf_stream(path, suffix, **load_kwargs)
    try:
        # .iter(batch_size) rather than iter(): inside a torch DataLoader worker, iter() would shard the file
        # over the workers itself; twinkle's workers each read the whole stream and transform their batches
        for batch in (stream.skip(start) if start else stream).iter(batch_size=READ_BATCH):
            yield from to_rows(batch)
    except Exception as exc:
        raise DataError(f"Could not stream {path!r}: {diagnose_file(path) or f'{type(exc).__name__}: {exc}'}"
                        ) from exc


def _count_hf(path: str, suffix: str, **load_kwargs: Any) -> int:
    return sum(len(next(iter(b.values()), [])) for b in _hf_stream(path, suffix, **load_kwargs).iter(READ_BATCH))
