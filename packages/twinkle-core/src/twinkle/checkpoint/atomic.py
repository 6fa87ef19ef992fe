"""Write a directory completely or not at all: temp name, then rename into place."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
    """A new empty ``.NAME.tmp-<token>`` directory beside ``final`` (:func:`commit` renames it into place).

    Split from :func:`atomic_directory` for writes that finish later (an asynchronous checkpoint).
    """
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
