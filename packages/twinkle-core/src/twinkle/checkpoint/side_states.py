"""The small training-state files every backend keeps beside its weights and optimizer state: the lr
scheduler, the fp16 GradScaler and the RNG state.

A resume reads and checks all of them against the live objects first (:func:`read_side_states`) and
applies them only once every file of the checkpoint passed (:func:`apply_side_states`), so it is
all-or-nothing whatever the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle.checkpoint.io import safe_torch_load
from twinkle.checkpoint.layout import SCALER_FILE, SCHEDULER_FILE, require_files
from twinkle.checkpoint.rng import check_rng_state, restore_rng_state
from twinkle.checkpoint.validate import check_state_like

#: (key in the restore dict, file, attribute of the optimizer group, what the file is for)
_SIDES = (("scheduler", SCHEDULER_FILE, "lr_scheduler", "lr scheduler state"),
          ("scaler", SCALER_FILE, "scaler", "fp16 GradScaler state"))


def read_side_states(directory: Path, group: Any, rng_path: Path) -> dict[str, Any]:
    """The group's scheduler and scaler states (for those it has) and the RNG state at ``rng_path``, each checked."""
    restore: dict[str, Any] = {}
    for key, name, attr, why in _SIDES:
        live = getattr(group, attr, None)
        if live is not None:
            require_files(directory, [name], why)
            restore[key] = safe_torch_load(directory / name)
            check_state_like(restore[key], live.state_dict(), f"{str(directory / name)!r}",
                             f"group {group.name!r}'s {key}")
    restore["rng"] = safe_torch_load(rng_path)
    check_rng_state(restore["rng"], f"{str(rng_path)!r}")
    return restore


def apply_side_states(group: Any, restore: dict[str, Any]) -> None:
    """Load what :func:`read_side_states` read into the group's scheduler and scaler, and restore the RNG."""
    for key, _, attr, _ in _SIDES:
        if key in restore:
            getattr(group, attr).load_state_dict(restore[key])
    restore_rng_state(restore["rng"])
