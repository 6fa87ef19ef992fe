"""Rank-aware logging: rank 0 speaks, the other ranks only warn (unless asked to speak too)."""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "TWINKLE_LOG_LEVEL"
ALL_RANKS_ENV = "TWINKLE_LOG_ALL_RANKS"


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class _RankFilter(logging.Filter):
    """Tag records with the rank and drop sub-warning records on ranks other than 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _rank()
        record.rank_tag = f"[rank {record.rank}]" if _world() > 1 else ""
        if record.rank != 0 and os.environ.get(ALL_RANKS_ENV, "") not in ("1", "true", "yes"):
            return record.levelno >= logging.WARNING
        return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (it may be redirected after the handler is made)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def get_logger(name: str = "twinkle") -> logging.Logger:
    """The twinkle logger (or a child of it): one stderr handler, rank-tagged, level from $TWINKLE_LOG_LEVEL."""
    root = logging.getLogger("twinkle")
    if not getattr(root, "_twinkle_configured", False):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s:%(name)s]%(rank_tag)s %(message)s"))
        handler.addFilter(_RankFilter())
        root.addHandler(handler)
        root.setLevel(os.environ.get(LEVEL_ENV, "INFO").upper())
        root.propagate = False
        root._twinkle_configured = True  # type: ignore[attr-defined]
    if name == "twinkle" or name.startswith("twinkle."):
        return logging.getLogger(name)
    return logging.getLogger(f"twinkle.{name}")
