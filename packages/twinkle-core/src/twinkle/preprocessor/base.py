"""Preprocessor: one raw row in, one conversation in the standard format out (see preprocessor.messages)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from twinkle.dataset.errors import DataError


class Preprocessor(ABC):
    """Base of row preprocessors. Subclasses implement :meth:`preprocess`.

    ``Dataset.map`` replaces each row by what the preprocessor returns (the raw columns are
    dropped). Return ``None`` to drop a row on purpose; raise :class:`DataError` for a bad row —
    ``map`` adds the row index, and with ``strict=False`` skips and counts it instead.
    """

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.preprocess(row)

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
                raise DataError(
                    f"{type(self).__name__} needs a {name!r} field, but the row has "
                    f"{', '.join(repr(k) for k in row) or 'no fields'}."
                )
            return default
        if not isinstance(value, str):
            raise DataError(f"{type(self).__name__}: field {name!r} must be a string, got {type(value).__name__}: "
                            f"{value!r:.80}.")
        return value
