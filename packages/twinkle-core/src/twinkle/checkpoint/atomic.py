"""Write a directory completely or not at all: temp name, then rename into place.

:func:`atomic_directory` is the single-process protocol; :func:`shared_atomic_directory` extends it
to every rank of a torchrun job (one temporary directory, one rename, one decision). Each is split
in two for writes that finish later (an asynchronous checkpoint): :func:`make_temporary` /
:func:`commit`, and :func:`shared_temporary` / :func:`shared_commit`. :func:`discard` deletes a
checkpoint directory the same careful way, and :func:`clean_stale` removes what a killed run left.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from twinkle.checkpoint.errors import CheckpointError


@contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``final``; on success it becomes ``final``.

    The temporary directory lives in the same parent (same filesystem), so the final step is a
    rename. An existing ``final`` is moved aside first and removed only after the new one is in
    place; if anything raises, the temporary directory is deleted and ``final`` is untouched.
    """
    tmp = make_temporary(final)
    try:
        yield tmp
        commit(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_temporary(final: str | os.PathLike[str]) -> Path:
    """A new empty ``.NAME.tmp-<token>`` directory beside ``final`` (:func:`commit` renames it into place)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Rename the complete ``tmp`` to ``final``, replacing an existing ``final`` only once ``tmp`` is in place."""
    tmp, final = Path(tmp), Path(final)
    _fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{tmp.name.rpartition('.tmp-')[2]}"
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
    tmp = shared_temporary(final)
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        shared_commit(tmp, final, ok, finish)


def shared_temporary(final: str | os.PathLike[str]) -> Path:
    """The temporary directory for ``final``, made by rank 0 and known to every rank (every rank calls this)."""
    from twinkle import collective

    if not collective.active():
        return make_temporary(final)
    name, lead_error = None, None
    if collective.rank() == 0:
        try:
            name = str(make_temporary(final))
        except Exception as exc:  # every rank must hear about it, not wait for a path
            lead_error = exc
    name = collective.broadcast_object(name)
    if name is None:
        if lead_error is not None:
            raise lead_error
        raise CheckpointError(f"Rank 0 could not create the temporary directory for {str(final)!r}; nothing was "
                              "written (see rank 0's error).")
    return Path(name)


def shared_commit(tmp: str | os.PathLike[str], final: str | os.PathLike[str], ok: bool = True,
                  finish: Callable[[Path], None] | None = None) -> None:
    """Every rank says whether its part of ``tmp`` succeeded (``ok``); rank 0 then runs ``finish(tmp)`` and
    renames ``tmp`` to ``final``, or deletes ``tmp`` if any rank failed; all ranks return together.

    A rank whose ``ok`` is False returns quietly (its own error is the one to raise); the others raise
    :class:`CheckpointError` naming the failed ranks, or rank 0's error from ``finish`` or the rename.
    """
    from twinkle import collective

    tmp, final = Path(tmp), Path(final)
    if not collective.active():
        if ok:
            _complete(tmp, final, [], finish, raise_error=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    failed = collective.failed_ranks(ok)
    lead_error = _complete(tmp, final, failed, finish) if collective.rank() == 0 else None
    outcome = collective.broadcast_object(None if lead_error is None else f"{type(lead_error).__name__}: "
                                                                        f"{lead_error}")
    if not ok:
        return
    if failed:
        raise CheckpointError(f"Saving {str(final)!r} failed on rank(s) {failed}; nothing was written and this rank "
                              "stopped too (see their error).")
    if lead_error is not None:
        raise lead_error
    if outcome is not None:
        raise CheckpointError(f"Rank 0 could not complete {str(final)!r} ({outcome}); nothing was written.")


def _complete(tmp: Path, final: Path, failed: list[int], finish: Callable[[Path], None] | None,
              raise_error: bool = False) -> BaseException | None:
    """Finish and rename when no rank failed, otherwise remove ``tmp``; returns (or raises) what went wrong."""
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    try:
        if finish is not None:
            finish(tmp)
        commit(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if raise_error:
            raise
        return exc
    return None


def discard(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint directory, renamed to a hidden name first: a kill mid-delete leaves only
    ``.NAME.trash`` (which :func:`clean_stale` removes), never a partial directory under a checkpoint name."""
    path = Path(path)
    trash = path.parent / f".{path.name}.trash"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_stale(root: str | os.PathLike[str]) -> None:
    """Remove the temporary, replaced and trash directories a killed run left in ``root`` (never checkpoints)."""
    root = Path(root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".trash")):
            shutil.rmtree(p, ignore_errors=True)


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
