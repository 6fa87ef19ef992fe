"""Batched ``map`` functions (dict of columns in, dict of columns out) and telling them from per-row ones.

A batched function (``datasets``' and upstream Twinkle's convention) gets ``{'col': [v0, v1, ...]}``
and returns ``{'col': [...]}``; it may return fewer rows (drop) or more (split) than it got. Called
on a single row it silently produces garbage (iterating a string gives one row per character), so
``map`` either knows (``batched=True``/``False``) or probes the function on a few rows; when the two
readings disagree it is read as batched (upstream Twinkle maps every plain function batched).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.dataset.errors import DataError, preview

#: sizes of the probe batches: a batched function's columns follow the batch size, a per-row function's lists do not
PROBE_SIZES = (3, 4)
PROBE_ROWS = max(PROBE_SIZES)


def function_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def to_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Row dicts -> one dict of columns (every column any row has; missing cells are None)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return {c: [row.get(c) for row in rows] for c in columns}


def _column_lengths(out: Any) -> set[int] | None:
    """The lengths of a returned dict's columns, or None when it is not a dict of lists."""
    if not isinstance(out, Mapping) or not out:
        return None
    if not all(isinstance(v, (list, tuple)) for v in out.values()):
        return None
    return {len(v) for v in out.values()}


def looks_batched(fn: Any, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``fn`` is a batched function, judged on the first rows; raises when it cannot be told.

    ``fn`` is called on batches of :data:`PROBE_SIZES` rows (the first rows, repeated if there are
    fewer). It reads as batched only if both calls work and return columns as long as the batch (a
    per-row function's own lists, such as a conversation's messages, do not grow with the batch).
    Then it is called on the first row alone: if that fails it is batched; if it agrees with the
    batch's first row the function works either way and is used per row; otherwise both readings
    "work" with different results, which is how a batched function fed one row looks: batched
    (upstream Twinkle's convention for every plain function). Pass ``batched=False`` to say otherwise.
    """
    if not rows:
        return False
    outs = []
    for size in PROBE_SIZES:
        try:
            out = fn(to_columns([rows[i % len(rows)] for i in range(size)]))
        except Exception:
            return False
        if _column_lengths(out) != {size}:
            return False
        outs.append(out)
    try:
        row_out = fn(dict(rows[0]))
    except Exception:
        return True
    first = {k: v[0] for k, v in outs[0].items()}
    return not (isinstance(row_out, Mapping) and dict(row_out) == first)


class BatchCall:
    """Call a batched function on a batch of columns; check and complete what it returns.

    Input columns the function does not return are carried over when it returns as many rows as
    it got, unless named in ``remove_columns``. A function that drops or splits rows must return
    every column to keep (or the others must be in ``remove_columns``): carried columns would not
    line up with its rows.
    """

    def __init__(self, fn: Any, remove_columns: Sequence[str] = ()) -> None:
        self.fn = fn
        self.remove_columns = set(remove_columns)

    def __call__(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        name = function_name(self.fn)
        where = f"rows {indices[0]}..{indices[-1]}" if indices else "an empty batch"
        try:
            out = self.fn({k: list(v) for k, v in batch.items()})
        except Exception as exc:
            message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            raise DataError(f"map({name}, batched=True) failed on {where}: {message}") from None
        lengths = _column_lengths(out)
        if lengths is None:
            raise DataError(f"map({name}, batched=True) returned {preview(out)} for {where}; a batched function "
                            "returns a dict of columns, each a list with one value per output row.")
        if len(lengths) != 1:
            sizes = {k: len(v) for k, v in out.items()}
            raise DataError(f"map({name}, batched=True) returned columns of different lengths {sizes} for {where}.")
        n_in, n_out = len(indices), lengths.pop()
        carried = [c for c in batch if c not in out and c not in self.remove_columns]
        if carried and n_out != n_in:
            raise DataError(
                f"map({name}, batched=True) returned {n_out} rows for a batch of {n_in} ({where}) but not the "
                f"columns {carried}, which then cannot follow its rows. Return them too, or drop them with "
                f"map(..., batched=True, remove_columns={carried!r})."
            )
        return {**{c: list(batch[c]) for c in carried}, **{k: list(v) for k, v in out.items()}}
