"""Checkpoint helpers every backend reuses.

- :func:`atomic_directory`: write a checkpoint under a temporary name, rename it into place
  (:func:`make_temporary` / :func:`commit` when the writing finishes later: :class:`PendingSave`).
- :func:`checkpoint_path`: join ``output_dir`` and a save name, rejecting names that escape it.
- :func:`write_trainer_state` / :func:`read_trainer_state`: ``trainer_state.json``, validated.
- :func:`capture_rng_state` / :func:`restore_rng_state`: Python, NumPy and torch generators.
- :func:`safe_torch_load` / :func:`torch_save`: pickled state loaded with ``weights_only=True``.
- :func:`save_tokenizer`: the tokenizer and chat template beside the weights.
"""

from __future__ import annotations

from twinkle.checkpoint.atomic import atomic_directory, commit, make_temporary
from twinkle.checkpoint.errors import CheckpointError
from twinkle.checkpoint.io import safe_torch_load, torch_save
from twinkle.checkpoint.layout import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    checkpoint_path,
    require_files,
    validate_save_name,
)
from twinkle.checkpoint.pending import PendingSave
from twinkle.checkpoint.rng import capture_rng_state, restore_rng_state
from twinkle.checkpoint.state import TRAINER_STATE_VERSION, read_trainer_state, write_trainer_state
from twinkle.checkpoint.tokenizer import save_tokenizer

__all__ = [
    "OPTIMIZER_FILE",
    "PendingSave",
    "RNG_FILE",
    "SCALER_FILE",
    "SCHEDULER_FILE",
    "TRAINER_STATE_FILE",
    "TRAINER_STATE_VERSION",
    "CheckpointError",
    "atomic_directory",
    "capture_rng_state",
    "commit",
    "checkpoint_path",
    "make_temporary",
    "read_trainer_state",
    "require_files",
    "restore_rng_state",
    "safe_torch_load",
    "save_tokenizer",
    "torch_save",
    "validate_save_name",
    "write_trainer_state",
]
