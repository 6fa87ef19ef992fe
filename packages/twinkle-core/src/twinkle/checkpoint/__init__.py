"""Checkpoints: the manager every model uses, and the helpers it (and the Trainer's store) is built from.

- :class:`~twinkle.checkpoint.manager.CheckpointManager`: save / load / resume of a model over a backend's
  :class:`~twinkle.checkpoint.manager.CheckpointState` (the protocol a backend implements is documented there).
- :func:`begin_directory` / :class:`PendingSave`: a directory written under one temporary name by every rank
  and renamed once all succeeded (:func:`shared_atomic_directory`, :func:`shared_temporary` /
  :func:`shared_commit` underneath); :func:`discard`, :func:`rotate` (the newest N of a family of
  checkpoints are kept), :func:`clean_stale`.
- :func:`checkpoint_path` / :func:`save_target`: where a named save goes (never replacing a user's directory).
- :func:`check_finite`: refuse to save NaN/inf trainable weights (all ranks agree).
- ``twinkle.checkpoint.manifest``: ``manifest.json`` with every file's size and xxh3 checksum.
- :func:`write_trainer_state` / :func:`read_trainer_state`: ``trainer_state.json``, validated.
- :func:`capture_rng_state` / :func:`restore_rng_state`: Python, NumPy and torch generators.
- :func:`safe_torch_load` / :func:`torch_save`: pickled state loaded with ``weights_only=True``.
- :func:`check_rng_state`, :func:`check_state_like`, :func:`check_optimizer_state`: a side file fits, checked
  before anything changes (resumes are all-or-nothing).
- ``twinkle.checkpoint.dcp_safe``: torch.distributed.checkpoint directories read without running pickled code.
- :func:`save_tokenizer`: the tokenizer and chat template beside the weights.
"""

from __future__ import annotations

from twinkle.checkpoint.atomic import (
    atomic_directory,
    clean_stale,
    commit,
    discard,
    make_temporary,
    rotate,
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
from twinkle.checkpoint.pending import PendingSave, begin_directory
from twinkle.checkpoint.rng import capture_rng_state, check_rng_state, restore_rng_state
from twinkle.checkpoint.state import TRAINER_STATE_VERSION, read_trainer_state, write_trainer_state
from twinkle.checkpoint.tokenizer import save_tokenizer
from twinkle.checkpoint.validate import check_optimizer_state, check_state_like

__all__ = ["OPTIMIZER_FILE", "RNG_FILE", "SCALER_FILE", "SCHEDULER_FILE", "TRAINER_STATE_FILE", "TRAINER_STATE_VERSION",
           "CheckpointError", "PendingSave", "atomic_directory", "begin_directory", "capture_rng_state", "check_finite",
           "check_optimizer_state", "check_rng_state", "check_state_like", "checkpoint_path", "clean_stale", "commit",
           "discard", "is_checkpoint_dir", "make_temporary", "read_trainer_state", "require_files",
           "restore_rng_state", "rotate", "safe_torch_load", "save_target", "save_tokenizer",
           "shared_atomic_directory", "shared_commit", "shared_temporary", "torch_save", "validate_save_name",
           "write_trainer_state"]
