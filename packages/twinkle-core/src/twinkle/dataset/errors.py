"""The error every data-path component raises for bad input: it names the row (or source) and the fix."""

from __future__ import annotations

from twinkle.errors import TwinkleError


class DataError(TwinkleError, ValueError):
    """A dataset source, row or setting that cannot be used as given.

    Takes a single message argument so it pickles across ``datasets.map(num_proc=...)`` workers.
    """


def preview(value: object, limit: int = 160) -> str:
    """A short repr of a row for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
