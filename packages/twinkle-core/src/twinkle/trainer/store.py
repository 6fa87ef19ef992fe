"""Trainer checkpoints in ``work_dir/checkpoints``: atomic, verifiable, rotated, found again on resume.

A checkpoint is ``step-00000012/`` holding ``model/`` (the model's own ``save(save_optimizer=True)``:
weights, optimizer, scheduler, RNG, data position, its own manifest), ``trainer.json`` (the Trainer's own
progress) and ``manifest.json`` (every file with its size and xxh3 checksum, ``twinkle.checkpoint.manifest``),
written last. The directory's life is core's (``twinkle.checkpoint``: one temporary name for every rank,
renamed once all succeeded; ``rotate``; ``discard``; ``clean_stale``), so a directory under its final name
is complete; :func:`verify` re-checks the manifest so a damaged one (missing, truncated or bit-flipped
file) is detected before anything is loaded.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from twinkle.checkpoint import CheckpointError, PendingSave, begin_directory, shared_atomic_directory
from twinkle.checkpoint import clean_stale as clean_stale  # core's, reached through this module by the Trainer
from twinkle.checkpoint import discard as discard
from twinkle.checkpoint import rotate as rotate_family
from twinkle.checkpoint.manifest import MANIFEST_FILE, verify_manifest, write_manifest
from twinkle.log import get_logger

logger = get_logger()
MANIFEST = MANIFEST_FILE
TRAINER_FILE = "trainer.json"
MODEL_SUBDIR = "model"
#: the latest-only snapshot (``snapshot_interval``) beside the step-N checkpoints
SNAPSHOT = "snapshot"
_NAME = re.compile(r"^step-(\d+)$")
#: test hook: seconds to sleep after the files are written and before the rename (reliability tests)
SAVE_SLEEP_ENV = "TWINKLE_TRAINER_TEST_SAVE_SLEEP"


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def write_checkpoint(root: Path, step: int, save_model: Any, trainer_state: dict[str, Any],
                     name: str | None = None) -> Path:
    """Build ``root/step-N`` (or ``root/name``, replacing it) atomically: ``save_model(tmp)`` writes
    ``tmp/model``, then trainer.json, manifest.

    Under torchrun every rank calls this: every rank runs ``save_model`` into the same temporary
    directory (sharded saves need them all); once all succeeded rank 0 writes trainer.json and the
    manifest and renames the directory (``shared_atomic_directory``).
    """
    final = root / (name or checkpoint_name(step))
    with shared_atomic_directory(final, finish=lambda tmp: _finish(tmp, step, trainer_state)) as tmp:
        save_model(tmp)
    return final


class PendingCheckpoint(PendingSave):
    """A checkpoint whose model files are still being written (``async_checkpoint``).

    Until :meth:`finish` it exists only as ``.step-N.tmp-*`` (removed by ``clean_stale`` after a crash);
    :meth:`finish` waits for the writes, then rank 0 adds trainer.json and the manifest and renames it,
    once every rank's writes succeeded.
    """

    def finish(self) -> Path:
        """Complete it under its final name (every rank calls this)."""
        return Path(self.wait())


def begin_checkpoint(root: Path, step: int, save_model: Any, trainer_state: dict[str, Any],
                     name: str | None = None) -> PendingCheckpoint:
    """Start ``root/step-N`` (or ``root/name``): ``save_model(tmp)`` returns the model's pending save."""
    return begin_directory(root / (name or checkpoint_name(step)), lambda tmp: [save_model(tmp)],
                           finish=lambda tmp: _finish(tmp, step, trainer_state), kind=PendingCheckpoint)


def _finish(tmp: Path, step: int, trainer_state: dict[str, Any]) -> None:
    (tmp / TRAINER_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
    delay = float(os.environ.get(SAVE_SLEEP_ENV, "0") or 0)
    if delay > 0:
        time.sleep(delay)
    write_manifest(tmp, step=step)


def verify(path: Path, checksums: bool = True) -> dict[str, Any]:
    """The checkpoint's trainer state, or CheckpointError saying why it is incomplete or damaged.

    ``checksums=False`` skips reading every byte (presence and sizes only).
    """
    verify_manifest(path, checksums=checksums)
    try:
        return json.loads((path / TRAINER_FILE).read_text())
    except ValueError as exc:
        raise CheckpointError(f"{str(path / TRAINER_FILE)!r} is not valid JSON ({exc}).") from exc


def named_step(path: Path) -> int | None:
    """The step a checkpoint is named for: ``step-N``'s N, the snapshot's manifest step (None: unreadable)."""
    match = _NAME.match(path.name)
    if match:
        return int(match.group(1))
    try:
        step = json.loads((path / MANIFEST).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def list_checkpoints(root: Path, with_snapshot: bool = False) -> list[tuple[int, Path]]:
    """``(step, path)`` of every directory named like a checkpoint, oldest first (complete or not).

    ``with_snapshot``: the snapshot too, at the step its manifest records (a full checkpoint of the
    same step sorts after it).
    """
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), 1, p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    snapshot = root / SNAPSHOT
    if with_snapshot and snapshot.is_dir():
        try:
            found.append((int(json.loads((snapshot / MANIFEST).read_text())["step"]), 0, snapshot))
        except (OSError, ValueError, KeyError, TypeError):
            found.append((-1, 0, snapshot))  # unreadable: tried last, reported as damaged by verify()
    return [(step, path) for step, _, path in sorted(found)]


def complete_checkpoints(root: Path, checksums: bool = False) -> list[tuple[int, Path]]:
    """The checkpoints that pass :func:`verify` (sizes only unless ``checksums``), oldest first."""
    result = []
    for step, path in list_checkpoints(root):
        try:
            verify(path, checksums=checksums)
        except CheckpointError:
            continue
        result.append((step, path))
    return result


def rotate(root: Path, maxkeep: int | None, written: Path | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``maxkeep`` (never the newest, never ``written``: the one
    just saved, which counts among the kept); return what went. Damaged checkpoints are left for a human."""
    return rotate_family([path for _, path in complete_checkpoints(root)], maxkeep, written=written)

