"""Rotation: keep the newest N of a family of checkpoint directories (``step-00000012``, ...)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from twinkle.checkpoint.atomic import discard


def rotate(family: Sequence[Path], keep: int | None, written: Path | None = None,
           protected: Collection[str] = ()) -> list[Path]:
    """Delete the members of ``family`` (listed oldest first) older than its newest ``keep``; return what went.

    ``keep`` None or <= 0 keeps everything. Never deleted, wherever they sort: ``written`` (the checkpoint
    just saved) and a directory whose name is in ``protected`` (which does not count towards ``keep``).
    Each goes through :func:`~twinkle.checkpoint.atomic.discard`: a kill mid-delete never leaves half a
    checkpoint under its name.
    """
    if keep is None or keep <= 0:
        return []
    members = [Path(p) for p in family if Path(p).name not in protected]
    doomed = [p for p in members[:-keep] if written is None or p != Path(written)]
    for path in doomed:
        discard(path)
    return doomed
