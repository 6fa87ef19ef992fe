"""A checkpoint directory being written: :func:`begin_directory` and the :class:`PendingSave` it returns.

One path for one process, many ranks and background writes: the directory is written under one
temporary name (rank 0 makes it, every rank writes into it), and :meth:`PendingSave.wait` puts it
under its final name once every rank's writes succeeded -- or removes it and raises on every rank.
A synchronous save is a pending save waited for at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from twinkle.checkpoint.atomic import shared_commit, shared_temporary


class PendingSave:
    """Files being written by background futures; :meth:`wait` finishes the checkpoint and returns its path.

    Training may go on meanwhile. ``finish(ok)`` (under torchrun the agreement of every rank, then
    the rename into place, or the removal when a write failed anywhere) runs in :meth:`wait`, on the
    calling thread: every rank must call it, also one whose write failed, so no rank waits forever.
    Until then the checkpoint exists only under a temporary name. A pending save may itself be one of
    another's futures (a model's save inside a Trainer checkpoint).
    """

    def __init__(self, path: str, futures: Sequence[Any], finish: Callable[[bool], None]) -> None:
        self.path = path
        self._futures = list(futures)
        self._finish: Callable[[bool], None] | None = finish

    @property
    def final(self) -> Path:
        """The name the checkpoint has once :meth:`wait` returned."""
        return Path(self.path)

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

    result = wait  # awaited like a future when it is one of another save's writes


def begin_directory(final: str | os.PathLike[str], write: Callable[[Path], Iterable[Any] | None],
                    finish: Callable[[Path], None] | None = None, kind: type[PendingSave] = PendingSave) -> Any:
    """Every rank: ``write(tmp)`` into the shared temporary directory of ``final``; returns the pending save.

    ``write`` writes its files now and returns the futures of those still being written (or None).
    On :meth:`PendingSave.wait` rank 0 runs ``finish(tmp)`` once every rank's writes succeeded (a
    manifest, say) and renames the directory to ``final``. If ``write`` raises on a rank, the directory
    is removed and the error raised there; the other ranks learn of it when they wait.
    """
    final = Path(final)
    tmp = shared_temporary(final)
    try:
        futures = list(write(tmp) or [])
    except BaseException:
        shared_commit(tmp, final, ok=False)
        raise
    return kind(str(final), futures, lambda ok: shared_commit(tmp, final, ok, finish))
