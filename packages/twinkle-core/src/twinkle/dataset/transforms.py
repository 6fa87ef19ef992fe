"""The batched functions Dataset hands to ``datasets.map`` (picklable, so ``num_proc`` works).

A row that must go (a truncated-away row, a bad row under ``strict=False``) is kept in the map
output with a reason in DROP_COLUMN and removed afterwards by :func:`drop_marked`, so the
warning can say how many rows went and why, whichever worker dropped them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from twinkle.dataset.errors import DataError, preview
from twinkle.log import get_logger

if TYPE_CHECKING:
    import datasets

DROP_COLUMN = "__twinkle_drop__"
REASON_SEP = "\t"  # a reason is "category" or "category<TAB>example detail"
ENCODED_COLUMNS = ("input_ids", "labels", "attention_mask", "position_ids", "length")


def to_rows(batch: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    columns = list(batch)
    n = len(batch[columns[0]]) if columns else 0
    return [{c: batch[c][i] for c in columns} for i in range(n)]


class PreprocessBatch:
    """Apply a Preprocessor row by row; the output replaces the row."""

    def __init__(self, preprocessor: Any, columns: list[str], strict: bool) -> None:
        self.preprocessor = preprocessor
        self.columns = columns
        self.strict = strict
        self.name = type(preprocessor).__name__

    def __call__(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {c: [] for c in self.columns}
        out[DROP_COLUMN] = []
        for row, index in zip(to_rows(batch), indices):
            reason = None
            try:
                result = self._one(row)
            except Exception as exc:
                message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
                if self.strict:
                    raise DataError(
                        f"{self.name} failed on row {index}: {message} Row: {preview(row)}. Fix the row, or pass "
                        "strict=False to map() to skip and count such rows."
                    ) from None
                result, reason = None, f"invalid{REASON_SEP}row {index}: {message}"
            if result is None and reason is None:
                reason = f"returned None by {self.name}"
            if result is not None and not isinstance(result, Mapping):
                raise DataError(f"{self.name} returned a {type(result).__name__} for row {index}; expected a dict.")
            if result is not None:
                _check_columns(result, self.columns, self.name, index)
            for c in self.columns:
                out[c].append(result.get(c) if result is not None else None)
            out[DROP_COLUMN].append(reason)
        return out


    def _one(self, row: dict[str, Any]) -> Any:
        proc = self.preprocessor
        if not getattr(proc, "overrides_call", lambda: False)():
            return proc(row)
        # upstream Twinkle's batched __call__: a one-row batch in, a batch of at most one row out
        out = proc.map_col_to_row(proc({k: [v] for k, v in row.items()}))
        if len(out) > 1:
            raise DataError(f"{self.name}.__call__ returned {len(out)} rows for one; a preprocessor maps a row to "
                            "one row (or none). Use a plain batched function with Dataset.map for that.")
        return out[0] if out else None


def _check_columns(result: Mapping[str, Any], columns: list[str], name: str, index: int) -> None:
    """A preprocessor output field the dataset has no column for would be lost: refuse it."""
    lost = [c for c in result if c not in columns and result[c]]
    if lost:
        raise DataError(f"{name} returned {lost} for row {index} but the mapped dataset has no such column "
                        f"(columns: {columns}). A preprocessor that adds images/videos to rows without such source "
                        "columns declares them: output_features() -> message_features(media=True).")


def preprocess_features(preprocessor: Any, source: Any) -> dict[str, Any]:
    """The preprocessor's output features; the media columns too when the source carries images or videos
    (an image/video column, or message contents given as lists of parts)."""
    from twinkle.multimodal.media import IMAGE_COLUMNS, VIDEO_COLUMNS, media_features

    features = dict(preprocessor.output_features())
    source = dict(source or {})
    if "images" not in features and (set(source) & {*IMAGE_COLUMNS, *VIDEO_COLUMNS} or any(
            not _text_content(source[c]) for c in ("messages", "conversations") if c in source)):
        features.update(media_features())
    return features


def _text_content(feature: Any) -> bool:
    """Whether a messages/conversations feature holds plain string contents."""
    import datasets

    inner = getattr(feature, "feature", feature)
    if isinstance(inner, list) and inner:
        inner = inner[0]
    if not isinstance(inner, dict):
        return True
    content = inner.get("content", inner.get("value"))
    return content is None or isinstance(content, datasets.Value)


class RowCall:
    """Call a plain function on one row, naming the row if it fails.

    For ``map`` the function returns a dict whose keys update the row (``datasets.map`` semantics);
    for ``filter`` it returns whether to keep the row.
    """

    def __init__(self, fn: Any, action: str) -> None:
        self.fn = fn
        self.action = action

    def __call__(self, row: dict[str, Any], index: int) -> Any:
        try:
            return self.fn(row)
        except Exception as exc:
            message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            name = getattr(self.fn, "__name__", type(self.fn).__name__)
            raise DataError(f"{self.action}({name}) failed on row {index}: {message} Row: {preview(row)}.") from None


class EncodeBatch:
    """Encode rows with a Template; rows it drops are marked with the reason.

    Rows with ``chosen`` and ``rejected`` columns are preference rows: each becomes two rows
    (``Template.preference_pair``: chosen, then rejected) whose ``group_id`` is the source row's
    index, so packing keeps the pair together (a pair truncation drops goes as one marked row).
    A ``group_id`` column of the rows themselves (a pair stored as two rows) is kept.
    """

    def __init__(self, template: Any) -> None:
        self.template = template
        self.columns = (*ENCODED_COLUMNS, *_extra_features(template))

    def __call__(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        if is_preference(batch):
            return self._pairs(batch, indices)
        from twinkle.dataset.packing import GROUP_COLUMN

        results = self.template.batch_encode(to_rows(batch), indices)
        out: dict[str, list[Any]] = {c: [] for c in (*self.columns, DROP_COLUMN)}
        for encoded, reason in results:
            self._add(out, encoded, reason)
        if GROUP_COLUMN in batch:  # rows the data marks as one group (one answer each) stay marked
            out[GROUP_COLUMN] = list(batch[GROUP_COLUMN])
        return out

    def _add(self, out: dict[str, list[Any]], encoded: Mapping[str, Any] | None, reason: str | None) -> None:
        for c in self.columns:
            out[c].append(encoded.get(c) if encoded is not None else ([] if c != "length" else 0))
        out[DROP_COLUMN].append(reason)

    def _pairs(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        from twinkle.dataset.packing import GROUP_COLUMN

        out: dict[str, list[Any]] = {c: [] for c in (*self.columns, GROUP_COLUMN, DROP_COLUMN)}
        drop = getattr(self.template, "truncation_strategy", None) == "delete"
        for row, index in zip(to_rows(batch), indices):
            pair, reason = self.template.preference_pair(row, index, drop=drop)
            for encoded in pair or (None,):
                self._add(out, encoded, reason)
                out[GROUP_COLUMN].append(index)
        return out


def is_preference(columns: Any) -> bool:
    """Whether rows with these columns are preference rows (``chosen`` and ``rejected``)."""
    return "chosen" in columns and "rejected" in columns


def _extra_features(template: Any) -> dict[str, Any]:
    """Columns a template encodes besides the token ones (a VL template's images/videos)."""
    extra = getattr(template, "extra_features", None)
    return dict(extra()) if callable(extra) else {}


def encoded_features(template: Any = None, source: Any = None) -> Any:
    """The features of encoded rows; ``source`` (the raw rows' features) decides the ``group_id`` column."""
    import datasets

    from twinkle.dataset.packing import GROUP_COLUMN

    ids = datasets.Sequence(datasets.Value("int32"))
    source = source or {}
    group = {GROUP_COLUMN: datasets.Value("int64")} if is_preference(source) else \
        {GROUP_COLUMN: source[GROUP_COLUMN]} if GROUP_COLUMN in source else {}
    return datasets.Features({
        "input_ids": ids, "labels": ids, "attention_mask": datasets.Sequence(datasets.Value("int8")),
        "position_ids": ids, "length": datasets.Value("int32"), **_extra_features(template), **group,
        DROP_COLUMN: datasets.Value("string"),
    })


def drop_marked(dataset: datasets.Dataset, what: str, num_proc: int | None = None) -> datasets.Dataset:
    """Remove rows marked in DROP_COLUMN, warning with the count per reason."""
    column = dataset.data.column(DROP_COLUMN)
    if column.null_count == len(dataset):
        return dataset.remove_columns(DROP_COLUMN)
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for reason in column.to_pylist():
        if reason is not None:
            category, _, example = reason.partition(REASON_SEP)
            counts[category] += 1
            examples.setdefault(category, example)
    kept = dataset.filter(lambda r: [x is None for x in r], input_columns=[DROP_COLUMN], batched=True,
                          num_proc=num_proc)
    detail = "; ".join(f"{n} {c}" + (f" (first: {examples[c]})" if examples[c] else "")
                       for c, n in counts.most_common())
    get_logger("twinkle.dataset").warning(
        "%s dropped %d of %d rows (%s).", what, len(dataset) - len(kept), len(dataset), detail
    )
    return kept.remove_columns(DROP_COLUMN)
