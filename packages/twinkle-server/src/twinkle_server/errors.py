"""The service's HTTP error answer, and the one not-found used for missing and foreign ids alike."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An HTTP error answer: ``status`` and a message saying what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found(what: str, ident: Any) -> ApiError:
    """The answer for a missing id -- and, identically, for an id another API key owns."""
    return ApiError(404, f"{what} {ident!r} not found (it does not exist or belongs to another API key).")
