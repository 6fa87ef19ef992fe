"""File names inside a checkpoint directory, and where a named checkpoint may be written."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from twinkle.checkpoint.errors import CheckpointError

TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
RNG_FILE = "rng_state.pt"


def validate_save_name(name: str) -> str:
    """A checkpoint name is one or more plain path parts below ``output_dir``: no ``..``, not absolute."""
    if not isinstance(name, str) or not name.strip():
        raise CheckpointError(f"Checkpoint name must be a non-empty string, got {name!r}.")
    if os.path.isabs(name) or name.startswith("~"):
        raise CheckpointError(
            f"Checkpoint name {name!r} is an absolute path; pass a plain name such as 'checkpoint-100' "
            "and choose the directory with output_dir=."
        )
    parts = Path(name).parts
    if any(part in ("..", ".") for part in parts):
        raise CheckpointError(
            f"Checkpoint name {name!r} would leave output_dir (it contains '..' or '.'); "
            "pass a plain name such as 'checkpoint-100'."
        )
    return name


def checkpoint_path(name: str, output_dir: str | os.PathLike[str] | None) -> Path:
    """``output_dir/name`` after validating ``name``; ``output_dir`` defaults to ``./output``."""
    validate_save_name(name)
    base = Path(output_dir if output_dir is not None else "output").expanduser()
    return base / name


def require_files(directory: str | os.PathLike[str], names: Iterable[str], why: str) -> Path:
    """The directory as a Path, or a CheckpointError naming each missing file and why it is needed."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"Checkpoint directory {str(path)!r} does not exist or is not a directory.")
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        present = sorted(p.name for p in path.iterdir())
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is missing {', '.join(missing)} ({why}). "
            f"It contains: {', '.join(present) or '(nothing)'}. Save it with save_optimizer=True, "
            "or resume with resume_only_model=True."
        )
    return path
