"""CheckpointManager: save / load / resume / get_state_dict of a model, the same for every backend.

What is the same everywhere lives here: argument checks, the checkpoint path (never replacing a
directory that is not a twinkle checkpoint unless ``overwrite=True``), the refusal to save NaN/inf
trainable weights (every rank agrees), the warning about a save inside an accumulation window, the
trainer-state read and the progress a resume returns. A backend supplies its *state*: an object
that writes and reads its files (:class:`CheckpointState`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from twinkle.checkpoint.finite import check_finite
from twinkle.checkpoint.layout import checkpoint_path, require_files, save_target
from twinkle.checkpoint.pending import PendingSave
from twinkle.checkpoint.state import read_trainer_state
from twinkle.log import get_logger
from twinkle.utils.checks import check_no_kwargs

if TYPE_CHECKING:
    from twinkle.model.optimizer_group import OptimizerGroup

logger = get_logger()


class CheckpointState(Protocol):
    """How a backend writes and reads its checkpoint files (see ``docs/architecture.md``)."""

    #: whether :meth:`write_async` works
    supports_async: bool

    def write(self, group: OptimizerGroup, final: Path, save_optimizer: bool, consumed_train_samples: int) -> None:
        """Write the group's checkpoint directory ``final`` completely or not at all."""

    def write_async(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                    consumed_train_samples: int) -> PendingSave:
        """Start writing ``final`` in the background; the returned save completes it (``wait()``)."""

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        """Load the group's HF-layout weights from ``directory``."""

    def resume(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> None:
        """Restore weights (and unless ``resume_only_model`` the training state), checking every file first."""

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """The group's weights under HF/PEFT names."""

    def trainable_tensors(self, group: OptimizerGroup) -> Iterable[tuple[str, Any]]:
        """``(name, tensor)`` of what the group trains, as held on this rank (shards are fine)."""


class CheckpointManager:
    """The checkpoint half of the TwinkleModel API over a backend's :class:`CheckpointState`."""

    def __init__(self, state: CheckpointState, owner: str) -> None:
        self.state = state
        self.owner = owner  # the model class's name, for messages

    def save(self, group: OptimizerGroup, name: str, output_dir: str | None = None, *, save_optimizer: bool = False,
             consumed_train_samples: int = 0, overwrite: bool = False, allow_non_finite: bool = False,
             async_save: bool = False, **kwargs: Any) -> str | PendingSave:
        """Write ``output_dir/name`` (see ``TwinkleModel.save``) and return its path, or a PendingSave."""
        check_no_kwargs("save", kwargs)
        if async_save and not self.state.supports_async:
            raise NotImplementedError(f"{self.owner} cannot save in the background; pass async_save=False "
                                      "(Trainer: async_checkpoint=false).")
        final = save_target(name, output_dir, overwrite)
        if not allow_non_finite:
            check_finite(self.state.trainable_tensors(group), f"group {group.name!r}")
        if save_optimizer and group.micro_step:
            logger.warning("Saving group %r in the middle of gradient accumulation (%d of %d micro-batches): the "
                           "pending gradients are not saved.", group.name, group.micro_step,
                           group.gradient_accumulation_steps)
        if async_save:
            return self.state.write_async(group, final, save_optimizer, consumed_train_samples)
        self.state.write(group, final, save_optimizer, consumed_train_samples)
        return str(final)

    def load(self, group: OptimizerGroup, name: str, output_dir: str | None = None) -> None:
        """Load weights saved by ``save`` into the group (``name`` is a path when output_dir is None)."""
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        self.state.load(group, directory)

    def resume(self, group: OptimizerGroup, checkpoint_dir: str, resume_only_model: bool) -> dict[str, int]:
        """Restore weights (+ training state unless ``resume_only_model``) and the group's progress."""
        directory = Path(checkpoint_dir).expanduser()
        require_files(directory, [], "checkpoint")
        trainer_state = read_trainer_state(directory)
        self.state.resume(group, directory, resume_only_model)
        return group.restore_progress(trainer_state)

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        return self.state.state_dict(group)
