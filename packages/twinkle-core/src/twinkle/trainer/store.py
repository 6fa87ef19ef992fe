"""Trainer checkpoints in ``work_dir/checkpoints``: atomic, verifiable, rotated, found again on resume.

A checkpoint is ``step-00000012/`` holding ``model/`` (the model's own ``save(save_optimizer=True)``:
weights, optimizer, scheduler, RNG, data position), ``trainer.json`` (the Trainer's own progress)
and ``manifest.json`` (every file with its size), written last. The whole directory is built
under a temporary name and renamed into place, so a directory under its final name is complete;
:func:`verify` re-checks the manifest so a damaged one (truncated file, missing file) is detected.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from twinkle.checkpoint import CheckpointError, atomic_directory, commit, make_temporary
from twinkle.log import get_logger

logger = get_logger()
MANIFEST = "manifest.json"
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

    Under torchrun every rank calls this: rank 0 owns the temporary directory and the rename, every
    rank runs ``save_model`` into the same temporary directory (sharded saves need them all).
    """
    from twinkle.trainer import _dist

    final = root / (name or checkpoint_name(step))
    if not _dist.active():
        with atomic_directory(final) as tmp:
            save_model(tmp)
            _finish(tmp, step, trainer_state)
        return final
    if _dist.rank() == 0:
        with atomic_directory(final) as tmp:
            _dist.broadcast_object(str(tmp))
            save_model(tmp)
            _dist.barrier()  # every rank's part is on disk
            _finish(tmp, step, trainer_state)
    else:
        tmp = Path(_dist.broadcast_object(None))
        save_model(tmp)
        _dist.barrier()
    _dist.barrier()  # renamed: every rank may read it now
    return final


class PendingCheckpoint:
    """A checkpoint whose model files are still being written (``async_checkpoint``).

    Until :meth:`finish` it exists only as ``.step-N.tmp-*`` (removed by :func:`clean_stale` after
    a crash); :meth:`finish` waits for the writes, adds trainer.json and the manifest and renames it.
    """

    def __init__(self, tmp: Path, final: Path, step: int, model_save: Any, trainer_state: dict[str, Any]) -> None:
        self.tmp, self.final, self.step = tmp, final, step
        self.model_save, self.trainer_state = model_save, trainer_state

    def done(self) -> bool:
        """This process's writes are over (finishing will not block on them)."""
        return self.model_save.done()

    def finish(self) -> Path:
        """Complete it under its final name (every rank calls this)."""
        from twinkle.trainer import _dist

        self.model_save.wait()
        if _dist.rank() == 0:
            _finish(self.tmp, self.step, self.trainer_state)
            commit(self.tmp, self.final)
        _dist.barrier()
        return self.final


def begin_checkpoint(root: Path, step: int, save_model: Any, trainer_state: dict[str, Any],
                     name: str | None = None) -> PendingCheckpoint:
    """Start ``root/step-N`` (or ``root/name``): ``save_model(tmp)`` returns the model's pending save."""
    from twinkle.trainer import _dist

    final = root / (name or checkpoint_name(step))
    if _dist.rank() == 0:
        tmp = Path(_dist.broadcast_object(str(make_temporary(final))))
    else:
        tmp = Path(_dist.broadcast_object(None))
    try:
        return PendingCheckpoint(tmp, final, step, save_model(tmp), trainer_state)
    except BaseException:
        if _dist.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _finish(tmp: Path, step: int, trainer_state: dict[str, Any]) -> None:
    (tmp / TRAINER_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
    delay = float(os.environ.get(SAVE_SLEEP_ENV, "0") or 0)
    if delay > 0:
        time.sleep(delay)
    files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=2) + "\n")


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's trainer state, or CheckpointError saying why it is incomplete or damaged."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{str(path)!r} has no readable {MANIFEST} ({type(exc).__name__}: {exc}).") from exc
    for name, size in files.items():
        target = path / name
        if not target.is_file():
            raise CheckpointError(f"{str(path)!r} is missing {name}.")
        if target.stat().st_size != size:
            raise CheckpointError(f"{str(path)!r}: {name} is {target.stat().st_size} bytes, the manifest says {size}.")
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


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The checkpoints that pass :func:`verify`, oldest first."""
    result = []
    for step, path in list_checkpoints(root):
        try:
            verify(path)
        except CheckpointError:
            continue
        result.append((step, path))
    return result


def rotate(root: Path, maxkeep: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``maxkeep`` (never the newest); return what went.

    A directory is first renamed to a hidden name and then removed, so a kill mid-delete never
    leaves a partial directory under a checkpoint name. Damaged checkpoints are left for a human.
    """
    if maxkeep is None or maxkeep <= 0:
        return []
    keep = max(maxkeep, 1)
    complete = complete_checkpoints(root)
    removed = []
    for _, path in complete[:-keep]:
        trash = path.parent / f".{path.name}.trash"
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def clean_stale(root: Path) -> None:
    """Remove temporary and trash directories a killed run left behind (they are never checkpoints)."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".trash")):
            shutil.rmtree(p, ignore_errors=True)

