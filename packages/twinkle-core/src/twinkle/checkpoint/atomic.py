"""A checkpoint directory's life on disk: written completely or not at all, deleted never by halves.

:func:`shared_atomic_directory`: every rank of a job (or the one process) writes into one temporary
directory beside the target, and rank 0 renames it into place once all succeeded -- or removes it, and
every rank raises. It is split in two for writes that finish later (an asynchronous checkpoint,
``twinkle.checkpoint.pending``): :func:`shared_temporary` / :func:`shared_commit`, built on the
single-process :func:`make_temporary` / :func:`commit`. :func:`discard` deletes a checkpoint through a
hidden name, :func:`rotate` keeps the newest N of a family of them, and :func:`clean_stale` removes
what a killed run left behind.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from twinkle.checkpoint.errors import CheckpointError


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
    """Yield the temporary directory of ``final`` (the same on every rank); on leaving, it becomes ``final``.

    Every rank calls this and writes its files into the temporary directory, which lives beside
    ``final`` (same filesystem: the last step is a rename). On leaving, the ranks agree: if every
    rank succeeded, rank 0 runs ``finish(tmp)`` (files that describe what all ranks wrote, such as a
    manifest) and renames the directory into place, an existing ``final`` being removed only once the
    new one is there; otherwise it deletes it, and the ranks that succeeded raise
    :class:`CheckpointError` naming the ones that did not. All ranks leave together, after the
    rename, so each may read ``final``. Multi-node runs need the output directory on a shared filesystem.
    """
    tmp = shared_temporary(final)
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        shared_commit(tmp, final, ok, finish)


atomic_directory = shared_atomic_directory  # the same protocol, named for callers on one process


def shared_temporary(final: str | os.PathLike[str]) -> Path:
    """The temporary directory for ``final``, made by rank 0 and known to every rank (every rank calls this)."""
    from twinkle import collective

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
    from twinkle.checkpoint.manifest import known_checksums, shared_checksums

    tmp, final = Path(tmp), Path(final)
    failed = collective.failed_ranks(ok)
    known: dict[str, tuple[int, int, str]] = {}
    if not failed and finish is not None and collective.world_size() > 1:
        # the manifest's checksums: each rank reads its share of the files, rank 0 writes the table
        try:
            share = shared_checksums(tmp, (collective.rank(), collective.world_size()))
        except OSError:  # rank 0 reads what is missing; the gather must not wait for this rank
            share = {}
        for table in collective.gather_object(share) or []:
            known.update(table)
    with known_checksums(known):
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


def _complete(tmp: Path, final: Path, failed: list[int], finish: Callable[[Path], None] | None) -> BaseException | None:
    """Finish and rename when no rank failed, otherwise remove ``tmp``; returns what went wrong."""
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    try:
        if finish is not None:
            finish(tmp)
        commit(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return exc
    return None


def discard(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint directory, renamed to a hidden name first: a kill mid-delete leaves only
    ``.NAME.trash-*`` (which :func:`clean_stale` removes), never a partial directory under a checkpoint name.

    Another process deleting the same directory at the same time (two jobs rotating one family) is no error:
    the rename is the one atomic step, so exactly one of them takes it, and a directory already gone is done.
    """
    path = Path(path)
    trash = path.parent / f".{path.name}.trash-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        return  # already discarded (by another process)
    shutil.rmtree(trash, ignore_errors=True)


def rotate(family: Sequence[Path], keep: int | None, written: Path | None = None,
           protected: Collection[str] = ()) -> list[Path]:
    """Delete the members of ``family`` (listed oldest first) beyond the newest ``keep``; return what went.

    ``keep`` None or <= 0 keeps everything. Never deleted, wherever they sort: the newest member and
    ``written`` (the checkpoint just saved), both counted among the ``keep``, and a directory whose name is
    in ``protected`` (which does not count).
    """
    if keep is None or keep <= 0:
        return []
    members = [Path(p) for p in family if Path(p).name not in protected]
    # ``family`` was listed before now: another process may have rotated some of it away since (no error)
    keepers = set(members[-1:]) | ({Path(written)} if written is not None and Path(written).is_dir() else set())
    others = [p for p in members if p not in keepers]
    room = keep - len(keepers)
    doomed = others[:-room] if room > 0 else others
    for path in doomed:
        discard(path)
    return doomed


def clean_stale(root: str | os.PathLike[str]) -> None:
    """Remove the temporary, replaced and trash directories a killed run left in ``root`` (never checkpoints)."""
    root = Path(root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name or ".trash" in p.name):
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
