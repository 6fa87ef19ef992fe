"""Checkpoint helpers every backend reuses.

- :func:`atomic_directory`: write a checkpoint under a temporary name, rename it into place;
  :func:`shared_atomic_directory`: the same for every rank of a torchrun job (:func:`make_temporary` /
  :func:`commit` and :func:`shared_temporary` / :func:`shared_commit` when the writing finishes later:
  :class:`PendingSave`).
- :func:`checkpoint_path`: join ``output_dir`` and a save name, rejecting names that escape it.
- :func:`save_target`: that path, refusing to replace a directory that is not a twinkle checkpoint.
- :func:`check_finite`: refuse to save NaN/inf trainable weights (all ranks agree).
- ``twinkle.checkpoint.manifest``: ``manifest.json`` with every file's size and xxh3 checksum.
- :func:`write_trainer_state` / :func:`read_trainer_state`: ``trainer_state.json``, validated.
- :func:`capture_rng_state` / :func:`restore_rng_state`: Python, NumPy and torch generators.
- :func:`safe_torch_load` / :func:`torch_save`: pickled state loaded with ``weights_only=True``.
- :func:`check_rng_state`, :func:`check_state_like`, :func:`check_optimizer_state`: a side file fits, checked
  before anything changes (resumes are all-or-nothing); :func:`read_side_states` / :func:`apply_side_states`:
  the scheduler, scaler and RNG files read and checked, then applied, the same way in every backend.
- ``twinkle.checkpoint.dcp_safe``: torch.distributed.checkpoint directories read without running pickled code.
- :func:`save_tokenizer`: the tokenizer and chat template beside the weights.
"""

from __future__ import annotations

from twinkle.checkpoint.atomic import (
    atomic_directory,
    commit,
    make_temporary,
    shared_atomic_directory,
    shared_commit,
    shared_temporary,
)
from twinkle.checkpoint.errors import CheckpointError
from twinkle.checkpoint.finite import check_finite
from twinkle.checkpoint.io import safe_torch_load, torch_save
from twinkle.checkpoint.layout import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    checkpoint_path,
    is_checkpoint_dir,
    require_files,
    save_target,
    validate_save_name,
)
from twinkle.checkpoint.pending import PendingSave
from twinkle.checkpoint.rng import capture_rng_state, check_rng_state, restore_rng_state
from twinkle.checkpoint.side_states import apply_side_states, read_side_states
from twinkle.checkpoint.state import TRAINER_STATE_VERSION, read_trainer_state, write_trainer_state
from twinkle.checkpoint.tokenizer import save_tokenizer
from twinkle.checkpoint.validate import check_optimizer_state, check_state_like

__all__ = [
    "OPTIMIZER_FILE",
    "PendingSave",
    "RNG_FILE",
    "SCALER_FILE",
    "SCHEDULER_FILE",
    "TRAINER_STATE_FILE",
    "TRAINER_STATE_VERSION",
    "CheckpointError",
    "apply_side_states",
    "atomic_directory",
    "capture_rng_state",
    "check_finite",
    "check_optimizer_state",
    "check_rng_state",
    "check_state_like",
    "checkpoint_path",
    "commit",
    "is_checkpoint_dir",
    "make_temporary",
    "read_side_states",
    "read_trainer_state",
    "require_files",
    "restore_rng_state",
    "safe_torch_load",
    "save_target",
    "save_tokenizer",
    "shared_atomic_directory",
    "shared_commit",
    "shared_temporary",
    "torch_save",
    "validate_save_name",
    "write_trainer_state",
]
