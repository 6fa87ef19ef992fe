"""Write rows to jsonl / parquet / csv a batch at a time (raw, mapped or encoded rows alike)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from twinkle.dataset.errors import DataError

SaveFormat = Literal["jsonl", "parquet", "csv"]
SUFFIX_FORMATS: dict[str, SaveFormat] = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                                         ".pq": "parquet", ".csv": "csv"}


def save_format(output_path: str, format: str | None) -> SaveFormat:
    """The format named, or the one the path's suffix implies (``.json`` means JSON Lines)."""
    if format is not None:
        fmt = "jsonl" if format == "json" else format
        if fmt not in ("jsonl", "parquet", "csv"):
            raise DataError(f"save_as format={format!r}; choose 'jsonl' (or 'json'), 'parquet' or 'csv'.")
        return fmt  # type: ignore[return-value]
    suffix = os.path.splitext(str(output_path))[1].lower()
    if suffix not in SUFFIX_FORMATS:
        raise DataError(f"save_as cannot tell the format of {str(output_path)!r} from its suffix; name it "
                        f"{', '.join(SUFFIX_FORMATS)} or pass format='jsonl' | 'parquet' | 'csv'.")
    return SUFFIX_FORMATS[suffix]


def _batches(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def check_flat(columns: dict[str, Any], fmt: str) -> None:
    """CSV holds scalars only: nested columns (messages, token ids) would come back as strings."""
    nested = [c for c, v in columns.items() if isinstance(v, (list, dict, tuple))]
    if fmt == "csv" and nested:
        raise DataError(f"CSV cannot hold the nested columns {nested} (they would be read back as strings); "
                        "save as .jsonl or .parquet.")


def save_rows(rows: Iterable[dict[str, Any]], output_path: str, format: str | None = None,
              batch_size: int = 1000) -> str:
    """Write ``rows`` to ``output_path``, ``batch_size`` rows in memory at a time.

    Args:
        rows: row dicts with the same columns.
        output_path: the file to write (its folder is created); written to ``<path>.tmp`` and renamed
            when complete, so a failed save leaves no half file under the name.
        format: ``'jsonl'`` (``'json'``), ``'parquet'`` or ``'csv'``; by default from the suffix.
        batch_size: rows per write.

    Returns:
        The path written.
    """
    import pyarrow as pa

    fmt = save_format(output_path, format)
    path = os.fspath(output_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    writer: Any = None
    schema: Any = None
    try:
        with open(tmp, "wb") as f:
            for batch in _batches(rows, batch_size):
                check_flat(batch[0], fmt)
                if fmt == "jsonl":
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in batch).encode())
                    continue
                table = pa.Table.from_pylist(batch, schema=schema)  # every batch in the first one's schema
                if writer is None:
                    schema = table.schema
                    if fmt == "parquet":
                        import pyarrow.parquet as pq

                        writer = pq.ParquetWriter(f, table.schema)
                    else:
                        import pyarrow.csv as pcsv

                        writer = pcsv.CSVWriter(f, table.schema)
                writer.write_table(table)
            if writer is not None:
                writer.close()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
