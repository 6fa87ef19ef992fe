"""Write a directory completely or not at all: temp name, then rename into place.

:func:`atomic_directory` is the single-process protocol; :func:`shared_atomic_directory` extends it
to every rank of a torchrun job (one temporary directory, one rename, one decision).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


@contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``final``; on success it becomes ``final``.

    The temporary directory lives in the same parent (same filesystem), so the final step is a
    rename. An existing ``final`` is moved aside first and removed only after the new one is in
    place; if anything raises, the temporary directory is deleted and ``final`` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = final.parent / f".{final.name}.tmp-{token}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_dir(tmp)
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{token}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def shared_atomic_directory(final: str | os.PathLike[str],
                            finish: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """:func:`atomic_directory` for every rank: rank 0 names the temporary directory and renames it.

    Every rank calls this and writes its files into the same temporary directory. On leaving, the
    ranks agree: if every rank succeeded, rank 0 runs ``finish(tmp)`` (files that describe what
    all ranks wrote, such as a manifest) and renames the directory into place; otherwise it
    deletes it, and the ranks that succeeded raise :class:`CheckpointError` naming the ones that
    did not. All ranks leave together, after the rename, so each may read ``final``. On a single
    process this is :func:`atomic_directory` followed by ``finish``. Multi-node runs need the
    output directory on a shared filesystem.
    """
    from twinkle import collective

    if not collective.active():
        with atomic_directory(final) as tmp:
            yield tmp
            if finish is not None:
                finish(tmp)
        return
    final = Path(final)
    lead = collective.rank() == 0
    manager = atomic_directory(final) if lead else None
    name, lead_error = None, None
    if lead:
        try:
            name = str(manager.__enter__())
        except Exception as exc:  # every rank must hear about it, not wait for a path
            lead_error = exc
    name = collective.broadcast_object(name)
    if name is None:
        if lead_error is not None:
            raise lead_error
        raise CheckpointError(f"Rank 0 could not create the temporary directory for {str(final)!r}; nothing was "
                              "written (see rank 0's error).")
    ok = False
    try:
        yield Path(name)
        ok = True
    finally:
        failed = collective.failed_ranks(ok)
        if lead:
            lead_error = _complete(manager, Path(name), failed, finish)
        outcome = collective.broadcast_object(None if lead_error is None else f"{type(lead_error).__name__}: "
                                                                            f"{lead_error}")
    if failed:
        raise CheckpointError(f"Saving {str(final)!r} failed on rank(s) {failed}; nothing was written and this rank "
                              "stopped too (see their error).")
    if lead_error is not None:
        raise lead_error
    if outcome is not None:
        raise CheckpointError(f"Rank 0 could not complete {str(final)!r} ({outcome}); nothing was written.")


def _complete(manager: Any, tmp: Path, failed: list[int],
              finish: Callable[[Path], None] | None) -> BaseException | None:
    """Rank 0: finish and rename when no rank failed, otherwise remove ``tmp``; returns what went wrong."""
    if failed:
        error = CheckpointError(f"rank(s) {failed} failed")
        manager.__exit__(CheckpointError, error, None)  # removes the temporary directory
        return None
    try:
        if finish is not None:
            finish(tmp)
        manager.__exit__(None, None, None)  # renames it into place
    except Exception as exc:
        manager.__exit__(type(exc), exc, exc.__traceback__)
        return exc
    return None


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk where the OS allows it (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
