"""save / load / resume_from_checkpoint / get_state_dict: what every backend does the same way.

Argument checks, the checkpoint path (never replacing a directory that is not a twinkle checkpoint
unless ``overwrite=True``), the refusal to save NaN/inf trainable weights, the warning about a save
inside an accumulation window, the trainer-state read and the progress returned by a resume live
here; a backend supplies how its files are written and read: ``_write_checkpoint``,
``_write_checkpoint_async`` (optional: ``save(async_save=True)``), ``_load_checkpoint`` (default
``_load_weights``), ``_resume_weights`` (which checks every file before
changing anything), ``_state_dict`` and ``_trainable_tensors``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from twinkle.checkpoint import (
    PendingSave,
    check_finite,
    checkpoint_path,
    read_trainer_state,
    require_files,
    save_target,
    save_tokenizer,
)
from twinkle.log import get_logger
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.utils.checks import check_no_kwargs

logger = get_logger()


class CheckpointMixin(ABC):
    """Checkpoint half of the TwinkleModel API (see ``twinkle.model.base``)."""

    #: whether ``save(async_save=True)`` works (the backend implements ``_write_checkpoint_async``)
    supports_async_save: bool = False

    # ----------------------------------------------------------- backend hooks
    @abstractmethod
    def _write_checkpoint(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                          consumed_train_samples: int) -> None:
        """Write the group's checkpoint directory ``final`` completely or not at all."""

    @abstractmethod
    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        """Load the group's HF-layout weights from ``directory``."""

    @abstractmethod
    def _resume_weights(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> None:
        """Restore weights (and unless ``resume_only_model`` the training state), checking every file first."""

    @abstractmethod
    def _state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """The group's weights under HF/PEFT names."""

    @abstractmethod
    def _trainable_tensors(self, group: OptimizerGroup) -> Iterable[tuple[str, Any]]:
        """``(name, tensor)`` of what the group trains, as held on this rank (shards are fine)."""

    def _write_checkpoint_async(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                                consumed_train_samples: int) -> PendingSave:
        """Start writing ``final`` in the background; the returned save completes it (``wait()``)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _write_checkpoint_async.")

    def _load_checkpoint(self, group: OptimizerGroup, directory: Path) -> None:
        self._load_weights(group, directory)

    # -------------------------------------------------------------- public API
    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             save_optimizer: bool = False, consumed_train_samples: int = 0, overwrite: bool = False,
             allow_non_finite: bool = False, async_save: bool = False, **kwargs: Any) -> str | PendingSave:
        """Write ``output_dir/name`` (``output_dir`` defaults to ``./output``) and return its path.

        An existing directory of that name is replaced only if it is a twinkle checkpoint (or
        ``overwrite=True``); NaN/inf trainable weights are refused, on every rank together, unless
        ``allow_non_finite=True``. ``async_save=True`` (where the backend supports it) returns a
        :class:`twinkle.checkpoint.PendingSave` at once: the weights and optimizer state are copied
        to host memory and written in the background while training goes on; ``pending.wait()``
        (every rank) puts the directory under its final name, until then it has a temporary one.
        """
        check_no_kwargs("save", kwargs)
        if async_save and not self.supports_async_save:
            raise NotImplementedError(f"{type(self).__name__} cannot save in the background; pass "
                                      "async_save=False (Trainer: async_checkpoint=false).")
        group = self._group(adapter_name)
        final = save_target(name, output_dir, overwrite)
        if not allow_non_finite:
            check_finite(self._trainable_tensors(group), f"group {group.name!r}")
        if save_optimizer and group.micro_step:
            logger.warning("Saving group %r in the middle of gradient accumulation (%d of %d micro-batches): the "
                           "pending gradients are not saved.", group.name, group.micro_step,
                           group.gradient_accumulation_steps)
        if async_save:
            return self._write_checkpoint_async(group, final, save_optimizer, consumed_train_samples)
        self._write_checkpoint(group, final, save_optimizer, consumed_train_samples)
        return str(final)

    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> None:
        """Load weights saved by :meth:`save` into the group (``name`` is a path when output_dir is None)."""
        check_no_kwargs("load", kwargs)
        group = self._group(adapter_name)
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        self._load_checkpoint(group, directory)

    def resume_from_checkpoint(self, checkpoint_dir: str, resume_only_model: bool = False, *,
                               adapter_name: str | None = None, **kwargs: Any) -> dict[str, int]:
        """Restore weights (+ optimizer, scheduler, scaler, RNG unless ``resume_only_model``) and progress.

        Every file is read and checked before anything is changed; returns the restored progress.
        """
        check_no_kwargs("resume_from_checkpoint", kwargs)
        group = self._group(adapter_name)
        directory = Path(checkpoint_dir).expanduser()
        require_files(directory, [], "checkpoint")
        state = read_trainer_state(directory)
        self._resume_weights(group, directory, resume_only_model)
        return group.restore_progress(state)

    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's weights: the adapter's (PEFT file keys) or the full model's."""
        check_no_kwargs("get_state_dict", kwargs)
        return self._state_dict(self._group(adapter_name))

    # ---------------------------------------------------------------- helpers
    def _save_preprocessing(self, group: OptimizerGroup, directory: Path) -> bool:
        """What encodes like the group's template beside the weights (its tokenizer; a VL template: its
        processor), else the tokenizer/processor files of the directory the model came from. False when
        there is neither."""
        return save_tokenizer(directory, group.template, getattr(self, "model_path", None))
