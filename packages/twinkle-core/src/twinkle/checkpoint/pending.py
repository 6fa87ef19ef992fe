"""A checkpoint still being written in the background (``save(..., async_save=True)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future


class PendingSave:
    """Files being written by background futures; :meth:`wait` finishes the checkpoint and returns its path.

    Training may go on meanwhile. ``finish`` (the rename into place, and under torchrun the
    agreement of every rank) runs in :meth:`wait`, on the calling thread: every rank must call it.
    Until then the checkpoint exists only under a temporary name.
    """

    def __init__(self, path: str, futures: Sequence[Future], finish: Callable[[], None]) -> None:
        self.path = path
        self._futures = list(futures)
        self._finish: Callable[[], None] | None = finish

    def done(self) -> bool:
        """Whether this process's background writes are over (``wait`` then returns at once)."""
        return all(f.done() for f in self._futures)

    def wait(self) -> str:
        """Block until the files are written, then put the checkpoint under its final name (once)."""
        for future in self._futures:
            future.result()  # a failed write raises here
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return self.path
