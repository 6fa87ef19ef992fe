"""An exclusive lock on a Trainer's work_dir, so a second run cannot delete the first one's checkpoints.

Rank 0 takes ``flock`` on ``work_dir/.twinkle.lock`` and writes who holds it (pid, host, start time,
command). The kernel drops the lock when that process dies, so a lock left by a killed run is stale
by construction: the next run takes it over and says so. A second live run fails at once with a
message naming the first. The lock is released when ``fit()`` returns.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from twinkle.errors import TwinkleError
from twinkle.log import get_logger

logger = get_logger()
LOCK_FILE = ".twinkle.lock"


class WorkDirLockedError(TwinkleError, RuntimeError):
    """Another live run holds the work_dir."""


class WorkDirLock:
    """``flock`` on ``work_dir/.twinkle.lock``; :meth:`release` (or process exit) frees it."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.path = work_dir / LOCK_FILE
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`WorkDirLockedError` naming the process that holds it."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not a POSIX system
            logger.warning("work_dir lock: this platform has no flock; two runs on %s are not prevented.",
                           self.work_dir)
            return
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the lock is held
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _describe(_read(handle))
            handle.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                logger.warning("work_dir lock: %s cannot be locked (%s); two runs on it are not prevented.",
                               self.path, exc)
                return
            raise WorkDirLockedError(
                f"work_dir {str(self.work_dir)!r} is in use by another run ({holder}). Two runs on one work_dir "
                "would overwrite and delete each other's checkpoints: wait for it to finish or stop it, or give "
                "this run another work_dir."
            ) from None
        previous = _read(handle)
        if previous:
            logger.warning("work_dir lock: took over a stale lock of %s, which is no longer running.",
                           _describe(previous))
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                                 "command": " ".join(sys.argv)[:500]}) + "\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Clear the holder record and unlock (the file stays: removing it would race with a new run)."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        import fcntl

        try:
            handle.seek(0)
            handle.truncate()
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def lock_work_dir(work_dir: Path, is_main: bool) -> WorkDirLock:
    """Rank 0 locks ``work_dir``; every rank learns the outcome (all raise together if it is taken)."""
    from twinkle import collective

    lock, problem = WorkDirLock(work_dir), None
    if is_main:
        try:
            lock.acquire()
        except WorkDirLockedError as exc:
            problem = str(exc)
    problem = collective.broadcast_object(problem)
    if problem:
        raise WorkDirLockedError(problem)
    return lock


def _read(handle: IO[str]) -> dict[str, Any] | None:
    try:
        handle.seek(0)
        text = handle.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a process that left no record"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {started}: {holder.get('command', '?')}"
