"""save / load / resume_from_checkpoint / get_state_dict: what every backend does the same way.

Argument checks, the checkpoint path, the warning about a save inside an accumulation window, the
trainer-state read and the progress returned by a resume live here; a backend supplies how its
files are written and read: ``_write_checkpoint``, ``_load_checkpoint`` (default ``_load_weights``),
``_resume_weights`` and ``_state_dict``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from twinkle.checkpoint import checkpoint_path, read_trainer_state, require_files
from twinkle.log import get_logger
from twinkle.model.optimizer_group import OptimizerGroup

logger = get_logger()


def _no_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"{method}() got unexpected arguments {sorted(kwargs)}.")


class CheckpointMixin(ABC):
    """Checkpoint half of the TwinkleModel API (see ``twinkle.model.base``)."""

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

    def _load_checkpoint(self, group: OptimizerGroup, directory: Path) -> None:
        self._load_weights(group, directory)

    # -------------------------------------------------------------- public API
    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             save_optimizer: bool = False, consumed_train_samples: int = 0, **kwargs: Any) -> str:
        """Write ``output_dir/name`` (``output_dir`` defaults to ``./output``) and return its path."""
        _no_kwargs("save", kwargs)
        group = self._group(adapter_name)
        final = checkpoint_path(name, output_dir)
        if save_optimizer and group.micro_step:
            logger.warning("Saving group %r in the middle of gradient accumulation (%d of %d micro-batches): the "
                           "pending gradients are not saved.", group.name, group.micro_step,
                           group.gradient_accumulation_steps)
        self._write_checkpoint(group, final, save_optimizer, consumed_train_samples)
        return str(final)

    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> None:
        """Load weights saved by :meth:`save` into the group (``name`` is a path when output_dir is None)."""
        _no_kwargs("load", kwargs)
        group = self._group(adapter_name)
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        self._load_checkpoint(group, directory)

    def resume_from_checkpoint(self, checkpoint_dir: str, resume_only_model: bool = False, *,
                               adapter_name: str | None = None, **kwargs: Any) -> dict[str, int]:
        """Restore weights (+ optimizer, scheduler, scaler, RNG unless ``resume_only_model``) and progress.

        Every file is read and checked before anything is changed; returns the restored progress.
        """
        _no_kwargs("resume_from_checkpoint", kwargs)
        group = self._group(adapter_name)
        directory = Path(checkpoint_dir).expanduser()
        require_files(directory, [], "checkpoint")
        state = read_trainer_state(directory)
        self._resume_weights(group, directory, resume_only_model)
        return group.restore_progress(state)

    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's weights: the adapter's (PEFT file keys) or the full model's."""
        _no_kwargs("get_state_dict", kwargs)
        return self._state_dict(self._group(adapter_name))

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _save_tokenizer(group: OptimizerGroup, directory: Path) -> None:
        """The group's tokenizer beside the weights, when its template has one."""
        tokenizer = getattr(group.template, "tokenizer", None)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(directory))
