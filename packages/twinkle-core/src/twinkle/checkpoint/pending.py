"""A checkpoint still being written in the background (``save(..., async_save=True)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future


class PendingSave:
    """Files being written by background futures; :meth:`wait` finishes the checkpoint and returns its path.

    Training may go on meanwhile. ``finish(ok)`` (under torchrun the agreement of every rank, then
    the rename into place, or the removal when a write failed anywhere) runs in :meth:`wait`, on the
    calling thread: every rank must call it, also one whose write failed, so no rank waits forever.
    Until then the checkpoint exists only under a temporary name.
    """

    def __init__(self, path: str, futures: Sequence[Future], finish: Callable[[bool], None]) -> None:
        self.path = path
        self._futures = list(futures)
        self._finish: Callable[[bool], None] | None = finish

    def done(self) -> bool:
        """Whether this process's background writes are over (``wait`` then returns at once)."""
        return all(f.done() for f in self._futures)

    def wait(self) -> str:
        """Block until the files are written, then put the checkpoint under its final name (once).

        A failed write raises here, after the other ranks were told (nothing is renamed anywhere).
        """
        if self._finish is None:
            return self.path
        finish, self._finish = self._finish, None
        ok = False
        try:
            for future in self._futures:
                future.result()
            ok = True
        finally:
            finish(ok)
        return self.path
