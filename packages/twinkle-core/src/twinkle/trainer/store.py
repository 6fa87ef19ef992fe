"""Trainer checkpoints in ``work_dir/checkpoints``: atomic, verifiable, rotated, found again on resume.

A checkpoint is ``step-00000012/`` holding ``model/`` (the model's own ``save(save_optimizer=True)``:
weights, optimizer, scheduler, RNG, data position), ``trainer.json`` (the Trainer's own progress)
and ``manifest.json`` (every file with its size and xxh3 checksum, ``twinkle.checkpoint.manifest``),
written last. The whole directory is built under a temporary name and renamed into place, so a
directory under its final name is complete; :func:`verify` re-checks the manifest so a damaged one
(missing, truncated or bit-flipped file) is detected before anything is loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from twinkle.checkpoint import CheckpointError, shared_atomic_directory, shared_commit, shared_temporary
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


class PendingCheckpoint:
    """A checkpoint whose model files are still being written (``async_checkpoint``).

    Until :meth:`finish` it exists only as ``.step-N.tmp-*`` (removed by :func:`clean_stale` after
    a crash); :meth:`finish` waits for the writes, then rank 0 adds trainer.json and the manifest and
    renames it, once every rank's writes succeeded (core's ``shared_commit``).
    """

    def __init__(self, tmp: Path, final: Path, step: int, model_save: Any, trainer_state: dict[str, Any]) -> None:
        self.tmp, self.final, self.step = tmp, final, step
        self.model_save, self.trainer_state = model_save, trainer_state

    def done(self) -> bool:
        """This process's writes are over (finishing will not block on them)."""
        return self.model_save.done()

    def finish(self) -> Path:
        """Complete it under its final name (every rank calls this)."""
        ok = False
        try:
            self.model_save.wait()
            ok = True
        finally:
            shared_commit(self.tmp, self.final, ok, finish=lambda tmp: _finish(tmp, self.step, self.trainer_state))
        return self.final


def begin_checkpoint(root: Path, step: int, save_model: Any, trainer_state: dict[str, Any],
                     name: str | None = None) -> PendingCheckpoint:
    """Start ``root/step-N`` (or ``root/name``): ``save_model(tmp)`` returns the model's pending save."""
    final = root / (name or checkpoint_name(step))
    tmp = shared_temporary(final)
    try:
        return PendingCheckpoint(tmp, final, step, save_model(tmp), trainer_state)
    except BaseException:
        shared_commit(tmp, final, ok=False)
        raise


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


def rotate(root: Path, maxkeep: int | None, protect: Path | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``maxkeep`` (never the newest, never ``protect``: the one
    just written); return what went.

    Each goes through :func:`discard`. Damaged checkpoints are left for a human.
    """
    if maxkeep is None or maxkeep <= 0:
        return []
    keep = max(maxkeep, 1)
    complete = [(step, path) for step, path in complete_checkpoints(root) if path != protect]
    if protect is not None and protect.is_dir():
        keep -= 1
    removed = []
    for _, path in (complete[:-keep] if keep > 0 else complete):
        discard(path)
        removed.append(path)
    return removed


def discard(path: Path) -> None:
    """Delete a checkpoint directory, renamed to a hidden name first: a kill mid-delete leaves only
    ``.NAME.trash`` (which :func:`clean_stale` removes), never a partial directory under a checkpoint name."""
    trash = path.parent / f".{path.name}.trash"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_stale(root: Path) -> None:
    """Remove temporary and trash directories a killed run left behind (they are never checkpoints)."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".trash")):
            shutil.rmtree(p, ignore_errors=True)

