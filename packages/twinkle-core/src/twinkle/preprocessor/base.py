"""Preprocessor: one raw row in, one conversation in the standard format out (see preprocessor.messages)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from twinkle.dataset.errors import DataError


def missing_fields(row: Mapping[str, Any], *names: str) -> str:
    """Why ``row`` lacks ``names``, for an error message: "the row's 'output' is null; it has 'instruction'".

    A JSON Lines file whose rows differ in their keys is read with every key as a column, so a row that
    lacks a key has it as None: such a field is named as null, and only the fields with a value are listed.
    """
    null = [n for n in names if n in row]
    present = [repr(k) for k, v in row.items() if v is not None]
    has = f"it has {', '.join(present)}" if present else "it has no non-null field"
    if null:
        return f"the row's {' and '.join(repr(n) for n in null)} {'is' if len(null) == 1 else 'are'} null; {has}"
    return f"the row has no such field; {has}"


class Preprocessor(ABC):
    """Base of row preprocessors. Subclasses implement :meth:`preprocess`.

    ``Dataset.map`` replaces each row by what the preprocessor returns (the raw columns are
    dropped). Return ``None`` to drop a row on purpose; raise :class:`DataError` for a bad row —
    ``map`` adds the row index, and with ``strict=False`` skips and counts it instead.
    """

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.preprocess(row)

    @classmethod
    def overrides_call(cls) -> bool:
        """Whether a subclass redefines ``__call__`` in upstream Twinkle's batched form (columns in, columns out).

        ``Dataset.map`` then hands it each row as a one-row batch and reads the one row back.
        """
        return cls.__call__ is not Preprocessor.__call__

    @staticmethod
    def map_col_to_row(rows: Mapping[str, list[Any]] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A batch of columns (``{'a': [1, 2]}``) as a list of rows (``[{'a': 1}, {'a': 2}]``); rows as they are."""
        if isinstance(rows, list):
            return rows
        columns = list(rows)
        n = len(rows[columns[0]]) if columns else 0
        return [{c: rows[c][i] for c in columns} for i in range(n)]

    @staticmethod
    def map_row_to_col(rows: list[Mapping[str, Any]] | dict[str, list[Any]],
                       keys: list[str] | None = None) -> dict[str, list[Any]]:
        """A list of rows as a batch of columns (``keys``, else the first row's); columns as they are."""
        if isinstance(rows, dict):
            return rows
        if not rows:
            return {k: [] for k in keys or ()}
        return {k: [row[k] for row in rows] for k in (keys or list(rows[0]))}

    @abstractmethod
    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """The standard-format conversation for ``row``, or None to drop it."""

    def output_features(self) -> Any:
        """The ``datasets.Features`` of the rows this preprocessor emits (the standard format)."""
        from twinkle.preprocessor.messages import message_features

        return message_features()

    def field(self, row: Mapping[str, Any], name: str, *, required: bool = True, default: Any = None) -> Any:
        """``row[name]`` as a string, with an error naming the field and the columns the row has."""
        value = row.get(name)
        if value is None:
            if required:
                raise DataError(f"{type(self).__name__} needs a {name!r} field, but {missing_fields(row, name)}.")
            return default
        if not isinstance(value, str):
            raise DataError(f"{type(self).__name__}: field {name!r} must be a string, got {type(value).__name__}: "
                            f"{value!r:.80}.")
        return value
