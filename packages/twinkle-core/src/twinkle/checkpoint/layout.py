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
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise CheckpointError(f"Checkpoint name {name!r} contains a control character (NUL, newline, tab...); "
                              "pass a plain name such as 'checkpoint-100'.")
    if os.path.isabs(name) or name.startswith("~"):
        raise CheckpointError(
            f"Checkpoint name {name!r} is an absolute path; pass a plain name such as 'checkpoint-100' "
            "and choose the directory with output_dir=."
        )
    # the parts as written: pathlib drops '.' parts ('a/./b' -> a, b; '.' -> nothing), which hid them from the rule
    parts = [part for part in name.replace("\\", "/").split("/") if part]
    if not parts or any(part.strip() in ("..", ".") for part in parts):
        raise CheckpointError(
            f"Checkpoint name {name!r} is not a plain name below output_dir (it is or contains '.' or '..', which "
            "would mean output_dir itself or a directory outside it); pass a plain name such as 'checkpoint-100'."
        )
    return name


def checkpoint_path(name: str, output_dir: str | os.PathLike[str] | None) -> Path:
    """``output_dir/name`` after validating ``name``; ``output_dir`` defaults to ``./output``."""
    validate_save_name(name)
    base = Path(output_dir if output_dir is not None else "output").expanduser()
    return base / name


def save_target(name: str, output_dir: str | os.PathLike[str] | None, overwrite: bool = False) -> Path:
    """Where ``save(name, output_dir)`` writes; refuses to replace anything that is not a twinkle checkpoint.

    Saving replaces an existing directory of that name. That is only allowed for an empty directory
    or a (complete or damaged) twinkle checkpoint -- one holding ``trainer_state.json`` or
    ``manifest.json`` (a ``save``'s, or the Trainer's) -- unless ``overwrite=True``: a user's project directory is
    never deleted because its name was passed to ``save``.
    """
    final = checkpoint_path(name, output_dir)
    if overwrite or not (final.exists() or final.is_symlink()):
        return final
    if final.is_dir() and is_checkpoint_dir(final):
        return final
    kind = "a directory that is not a twinkle checkpoint" if final.is_dir() else "a file"
    listing = ", ".join(sorted(p.name for p in final.iterdir())[:5]) if final.is_dir() else ""
    raise CheckpointError(
        f"Refusing to replace {str(final)!r}: it is {kind}{f' (it holds {listing})' if listing else ''}, and saving "
        "would delete it. Pick another name or output_dir, or pass overwrite=True to replace it."
    )


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """True for an empty directory or one holding ``trainer_state.json`` or ``manifest.json`` (twinkle's markers)."""
    from twinkle.checkpoint.manifest import MANIFEST_FILE

    try:
        names = {p.name for p in Path(path).iterdir()}
    except OSError:
        return False
    return not names or bool(names & {TRAINER_STATE_FILE, MANIFEST_FILE})


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
