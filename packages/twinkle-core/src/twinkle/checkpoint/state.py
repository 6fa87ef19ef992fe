"""trainer_state.json: the progress a resumed run continues from, validated on read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinkle.checkpoint.errors import CheckpointError
from twinkle.checkpoint.layout import TRAINER_STATE_FILE

TRAINER_STATE_VERSION = 1
#: each progress field with the largest value a real run reaches: far above any run, low enough that a value past it
#: (a careless tool's 10**30) is refused before it reaches an lr scheduler (int32 steps), the data sampler or a loop
LIMITS = {"cur_step": 2**31 - 1, "consumed_train_samples": 2**53, "gradient_accumulation_steps": 2**20}


def write_trainer_state(directory: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` (plus the format version) after checking the required fields."""
    payload = {"version": TRAINER_STATE_VERSION, **state}
    _validate(payload, "<in memory>")
    path = Path(directory) / TRAINER_STATE_FILE
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_trainer_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated contents of ``directory/trainer_state.json``, or a CheckpointError saying what is wrong."""
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{str(path)!r} does not exist; {str(directory)!r} is not a twinkle checkpoint "
            "(save it with model.save(name, save_optimizer=True))."
        )
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # ValueError: bad JSON, or an integer of 4300+ digits
        raise CheckpointError(f"{str(path)!r} is not valid JSON ({exc}); the checkpoint is corrupt.") from exc
    _validate(payload, str(path))
    return payload


def _validate(payload: Any, where: str) -> None:
    if not isinstance(payload, dict):
        raise CheckpointError(f"{where}: trainer state must be a JSON object, got {type(payload).__name__}.")
    version = payload.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= TRAINER_STATE_VERSION:
        raise CheckpointError(
            f"{where}: trainer state version {repr(version)[:40]} is not supported (this twinkle reads versions 1 to "
            f"{TRAINER_STATE_VERSION}); upgrade twinkle, or re-save the checkpoint with this one."
        )
    for key, limit in LIMITS.items():
        value = payload.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{where}: field {key!r} must be a non-negative integer, got {repr(value)[:40]}; "
                                  "the file was edited or damaged (resume from another checkpoint).")
        if value > limit:
            raise CheckpointError(f"{where}: field {key!r} is {str(value)[:40]}, beyond what any run reaches (at most "
                                  f"{limit}); the file was edited or damaged (resume from another checkpoint).")
    if payload["gradient_accumulation_steps"] < 1:
        raise CheckpointError(f"{where}: field 'gradient_accumulation_steps' must be >= 1, got "
                              f"{payload['gradient_accumulation_steps']}.")
