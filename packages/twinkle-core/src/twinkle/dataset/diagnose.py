"""Finding the row behind a data file that ``datasets`` could not read (or read wrongly).

``datasets``/pyarrow report "StopIteration", "Expected object or value at position 26", a raw
``UnicodeDecodeError`` on first access, or a silently mixed-type ``Json`` column. When that happens
the file is scanned here, line by line, to say which file, which line or row, which field, and how
to fix it. Nothing is scanned for files that load cleanly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from twinkle.dataset.errors import preview

TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".txt")


def diagnose_file(path: str) -> str | None:
    """The first concrete problem of a text data file (empty, non-UTF-8 line, bad JSON line, mixed types).

    The message names the line (or row), the field and the fix; the caller names the file.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TEXT_SUFFIXES:
        return None
    lines: list[tuple[int, str]] = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return (f"line {number} is not valid UTF-8 (byte {raw[exc.start:exc.start + 1]!r} at "
                        f"column {exc.start + 1}: {exc.reason}). Re-save the file as UTF-8 (e.g. "
                        f"`iconv -f latin1 -t utf-8`), or drop that line.")
            if text.strip():
                lines.append((number, text))
    if not lines:
        return "the file is empty: it holds no rows. Give at least one row (one JSON object per line for .jsonl)."
    if suffix == ".jsonl" or (suffix == ".json" and lines[0][1].lstrip().startswith("{") and len(lines) > 1):
        return _diagnose_json_lines(lines)
    if suffix == ".json":
        try:
            document = json.loads("".join(text for _, text in lines))
        except json.JSONDecodeError as exc:
            return f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        rows = document if isinstance(document, list) else [document]
        return type_mismatch((f"row {i}", r) for i, r in enumerate(rows))
    return None


def _diagnose_json_lines(lines: list[tuple[int, str]]) -> str | None:
    rows = []
    for number, text in lines:
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            return (f"line {number} is not valid JSON ({exc.msg} at column {exc.colno}): "
                    f"{preview(text.strip())}. Each line of a JSON Lines file must be one complete JSON object.")
        if not isinstance(row, Mapping):
            return (f"line {number} is a JSON {type(row).__name__}, not an object: {preview(row)}. Each "
                    "line must be an object such as {\"query\": ..., \"response\": ...}.")
        rows.append((f"line {number}", row))
    return type_mismatch(rows)


def type_mismatch(rows: Iterable[tuple[str, Any]]) -> str | None:
    """The first field whose type differs from the same field in an earlier row (None if all agree).

    ``rows`` are ``(where, row)`` pairs, ``where`` naming the row ("line 3", "row 2") in the message.
    """
    seen: dict[str, tuple[str, str, str, Any]] = {}
    for where, row in rows:
        if not isinstance(row, Mapping):
            return f"{where} is a {type(row).__name__}, not a dict/object: {preview(row)}."
        for shape, field, value in _fields(row):
            kind = _kind(value)
            if kind is None:
                continue
            first_kind, first_where, first_field, first_value = seen.setdefault(shape, (kind, where, field, value))
            if first_kind != kind:
                return (f"{where}: field {field!r} is {kind} ({preview(value, 60)}) but {first_where}'s "
                        f"{first_field!r} is {first_kind} ({preview(first_value, 60)}). Every row must use the same "
                        "type for a given field (a message's 'content' is a string; quote numbers as strings): "
                        "fix the row that differs.")
    return None


def _fields(row: Mapping[str, Any], prefix: str = "", shape_prefix: str = "", depth: int = 0) -> Iterable[
        tuple[str, str, Any]]:
    """``(shape, field, value)`` for every field of a row, nested objects and lists of objects included:
    ``messages[1].content`` has the shape ``messages[].content`` (one column type for every message)."""
    for key, value in row.items():
        field, shape = f"{prefix}{key}", f"{shape_prefix}{key}"
        yield shape, field, value
        if depth >= 4:  # a column's type is decided near the top; bounded for hostile nesting
            continue
        if isinstance(value, Mapping):
            yield from _fields(value, f"{field}.", f"{shape}.", depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    yield from _fields(item, f"{field}[{i}].", f"{shape}[].", depth + 1)


def _kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def loaded_problem(dataset: Any, json_source: bool) -> str | None:
    """What is wrong with a table ``datasets`` built without complaint: mixed-type columns, invalid UTF-8."""
    mixed = [name for name, feature in dataset.features.items() if type(feature).__name__ == "Json"]
    if mixed:
        return f"columns {mixed} hold values of different types in different rows"
    if json_source:  # pyarrow's JSON reader does not validate UTF-8; strings fail later, on first access
        try:
            dataset.data.table.validate(full=True)
        except Exception as exc:  # noqa: BLE001 - pyarrow.ArrowInvalid
            return f"it holds invalid text ({exc})"
    return None
