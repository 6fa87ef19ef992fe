"""The checkpoint manager: save / load / resume / get_state_dict of a model, written once for every backend.

:class:`CheckpointManager` owns everything that is the same whatever the backend:

* **the directory's life** (:func:`~twinkle.checkpoint.pending.begin_directory`): one temporary name beside
  the target, every rank's writes into it, the rename by rank 0 once all succeeded (or its removal, and an
  error on every rank); ``async_save=True`` returns the :class:`PendingSave` whose ``wait()`` completes it;
* the checks before a save: a safe name, never replacing a directory that is not a twinkle checkpoint
  (unless ``overwrite=True``), no NaN/inf trainable weights (every rank agrees);
* **the side files** beside the backend's: ``rng_state*.pt`` (every rank its own, named by the backend),
  and from rank 0 ``scheduler.pt``, ``scaler.pt`` (fp16), the tokenizer/processor and ``trainer_state.json``;
* ``manifest.json`` (every file's size and xxh3 checksum), written last, by rank 0;
* **resume, all or nothing**: the trainer state, the side files, the backend's state and the manifest are
  read and checked on every rank, the ranks agree, and only then is anything applied.

A backend supplies a :class:`CheckpointState`: its model and optimizer state and where they live on
disk -- nothing else. Its members are documented on the protocol, once, as
:mod:`twinkle.engine.backend` documents the engine's; a state is any object with them (no base class).
Rotation of a family of checkpoints is :func:`twinkle.checkpoint.atomic.rotate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from twinkle import collective
from twinkle.checkpoint.errors import CheckpointError
from twinkle.checkpoint.finite import check_finite
from twinkle.checkpoint.io import safe_torch_load, torch_save
from twinkle.checkpoint.layout import (
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    checkpoint_path,
    require_files,
    save_target,
)
from twinkle.checkpoint.manifest import MANIFEST_FILE, verify_manifest, write_manifest
from twinkle.checkpoint.pending import PendingSave, begin_directory
from twinkle.checkpoint.rng import capture_rng_state, check_rng_state, restore_rng_state
from twinkle.checkpoint.state import read_trainer_state, write_trainer_state
from twinkle.checkpoint.tokenizer import save_tokenizer
from twinkle.checkpoint.validate import check_state_like
from twinkle.log import get_logger
from twinkle.utils.checks import check_no_kwargs

if TYPE_CHECKING:
    from twinkle.model.optimizer_group import OptimizerGroup

logger = get_logger()
#: the group's objects whose state the manager keeps: (attribute, file, what it is); written by rank 0
SIDE_STATES = (("lr_scheduler", SCHEDULER_FILE, "lr scheduler state"), ("scaler", SCALER_FILE, "fp16 GradScaler state"))


class CheckpointState(Protocol):
    """A backend's model and optimizer state in a checkpoint directory (see the module docstring).

    Every rank calls each method; collectives inside are the backend's business. ``directory`` is the
    checkpoint's directory (a temporary one while saving).
    """

    #: whether ``write(..., async_save=True)`` writes in the background
    supports_async: bool
    #: the local directory the model came from (its tokenizer/processor files go beside the weights when the
    #: group has no template); None for a model built from a config
    model_path: str | None

    # -------------------------------------------------------------------- layout
    def rng_file(self, rank: int, world_size: int) -> str:
        """The name of ``rank``'s RNG file (``rng_state.pt`` on one process: the manager writes and reads it)."""

    def trainer_fields(self, async_save: bool) -> dict[str, Any]:
        """Backend fields of ``trainer_state.json`` beside the progress (precision, world size, strategy...)."""

    # -------------------------------------------------------------------- saving
    def write(self, group: OptimizerGroup, directory: Path, save_optimizer: bool,
              async_save: bool) -> list[Future]:
        """Write the group's weights (HF layout or PEFT adapter, plus shards where sharded) and, with
        ``save_optimizer``, its optimizer state; return the futures of writes still running (``async_save``)."""

    # ------------------------------------------------------------------- reading
    def read(self, group: OptimizerGroup, directory: Path, with_optimizer: bool) -> Any:
        """Read and check the weights (and with ``with_optimizer`` the optimizer state) against the group, changing
        nothing; raise CheckpointError saying what does not fit. Returns what :meth:`apply` loads."""

    def apply(self, group: OptimizerGroup, directory: Path, staged: Any) -> None:
        """Load what :meth:`read` checked (every rank's :meth:`read` succeeded): weights, then optimizer state."""

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        """Load HF-layout weights (a ``save_pretrained`` or adapter directory) into the group, checked first."""

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """The group's weights under HF/PEFT names."""

    def trainable_tensors(self, group: OptimizerGroup) -> Iterable[tuple[str, Any]]:
        """``(name, tensor)`` of what the group trains, as held on this rank (shards are fine)."""


class CheckpointManager:
    """The checkpoint half of the TwinkleModel API over a backend's :class:`CheckpointState`."""

    def __init__(self, state: CheckpointState, owner: str) -> None:
        self.state = state
        self.owner = owner  # the model class's name, for messages

    # -------------------------------------------------------------------- saving
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
        pending = begin_directory(final, lambda tmp: self._write(group, tmp, save_optimizer, consumed_train_samples,
                                                                 async_save), finish=write_manifest)
        return pending if async_save else pending.wait()

    def _write(self, group: OptimizerGroup, directory: Path, save_optimizer: bool, consumed_train_samples: int,
               async_save: bool) -> list[Future]:
        futures = self.state.write(group, directory, save_optimizer, async_save)
        rank = collective.rank()
        if save_optimizer:
            torch_save(capture_rng_state(), directory / self.state.rng_file(rank, collective.world_size()))
        if rank != 0:
            return futures
        for attr, file, _ in SIDE_STATES if save_optimizer else ():
            if getattr(group, attr, None) is not None:
                torch_save(getattr(group, attr).state_dict(), directory / file)
        save_tokenizer(directory, group.template, self.state.model_path)
        write_trainer_state(directory, group.trainer_state(consumed_train_samples,
                                                           has_optimizer_state=bool(save_optimizer),
                                                           **self.state.trainer_fields(async_save)))
        return futures

    # ------------------------------------------------------------------- reading
    def load(self, group: OptimizerGroup, name: str, output_dir: str | None = None) -> None:
        """Load weights saved by ``save`` into the group (``name`` is a path when output_dir is None)."""
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        self.state.load(group, directory)

    def resume(self, group: OptimizerGroup, checkpoint_dir: str, resume_only_model: bool,
               skip_checkpoint_validation: bool = False, pre_manifest: bool = False) -> dict[str, int]:
        """Restore weights (+ training state unless ``resume_only_model``) and the group's progress.

        Every file is read and checked on every rank and the ranks agree; then the manifest is verified (the
        ranks share the reading) and they agree again; only then is anything applied.
        ``skip_checkpoint_validation`` skips the manifest's checksum pass (sizes are still checked);
        ``pre_manifest`` accepts a directory without ``manifest.json`` (checked by structure only).
        """
        directory = Path(checkpoint_dir).expanduser()
        self._agreed(directory, lambda: self._require_manifest(directory, pre_manifest))
        trainer_state, sides, staged = self._agreed(directory, lambda: self._read(group, directory, resume_only_model))
        self._agreed(directory, lambda: self._verify(directory, skip_checkpoint_validation))
        self.state.apply(group, directory, staged)
        if sides is not None:
            for attr, _, _ in SIDE_STATES:
                if attr in sides:
                    getattr(group, attr).load_state_dict(sides[attr])
            restore_rng_state(sides["rng"])
        return group.restore_progress(trainer_state)

    def _read(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> tuple[Any, Any, Any]:
        """``(trainer state, side states, the backend's staged state)``, every file checked; nothing changes."""
        require_files(directory, [], "checkpoint")
        trainer_state = read_trainer_state(directory)
        sides = None if resume_only_model else self._read_sides(group, directory)
        return trainer_state, sides, self.state.read(group, directory, not resume_only_model)

    @staticmethod
    def _agreed(directory: Path, check: Callable[[], Any]) -> Any:
        """``check()`` on every rank, then the ranks agree (loads are collectives): a failure anywhere raises on
        every rank, the failed one with its own error, before anything was loaded."""
        problem, result = None, None
        try:
            result = check()
        except Exception as exc:
            problem = exc
        failed = collective.failed_ranks(problem is None)
        if problem is not None:
            raise problem
        if failed:
            raise CheckpointError(f"Checking {str(directory)!r} failed on rank(s) {failed}; nothing was loaded here "
                                  "either (see their error).")
        return result

    def _read_sides(self, group: OptimizerGroup, directory: Path) -> dict[str, Any]:
        """The group's scheduler and scaler states (for those it has) and this rank's RNG state, each checked."""
        if group.optimizer is None:
            raise RuntimeError(f"resume_from_checkpoint restores the optimizer of group {group.name!r}, which has "
                               "none: call set_optimizer('default', ...) (and set_lr_scheduler) first, or pass "
                               "resume_only_model=True.")
        own = self.state.rng_file(collective.rank(), collective.world_size())
        rng = next((directory / n for n in (own, RNG_FILE) if (directory / n).is_file()), None)
        if rng is None:  # a rank beyond the saved world falls back to rank 0's generators
            require_files(directory, [own], "RNG state for an exact resume")
        if (directory / SCHEDULER_FILE).is_file() and group.lr_scheduler is None:
            raise RuntimeError(f"{str(directory)!r} has an lr scheduler state but group {group.name!r} has no "
                               "scheduler: call set_lr_scheduler(...) before resume_from_checkpoint.")
        sides: dict[str, Any] = {}
        for attr, file, why in SIDE_STATES:
            live = getattr(group, attr, None)
            if live is not None:
                require_files(directory, [file], why)
                sides[attr] = safe_torch_load(directory / file)
                check_state_like(sides[attr], live.state_dict(), f"{str(directory / file)!r}",
                                 f"group {group.name!r}'s {attr}")
        sides["rng"] = safe_torch_load(rng)
        check_rng_state(sides["rng"], f"{str(rng)!r}")
        return sides

    @staticmethod
    def _require_manifest(directory: Path, pre_manifest: bool) -> None:
        """A checkpoint without a manifest is refused unless the caller vouches that it predates manifests."""
        require_files(directory, [], "checkpoint")
        if pre_manifest or (directory / MANIFEST_FILE).is_file():
            return
        raise CheckpointError(
            f"{str(directory)!r} has no {MANIFEST_FILE}, so its files cannot be checked: every checkpoint this twinkle "
            "saves has one, and a deleted manifest is how a modified directory would pass. If it was saved by a "
            "twinkle from before manifests, pass pre_manifest=True to resume it with the structural checks only.")

    def _verify(self, directory: Path, skip_checksums: bool) -> None:
        """The manifest's files are there with their sizes and (unless skipped) checksums; the ranks share the
        reading. A checkpoint written before manifests (``pre_manifest``) has none: structural checks only."""
        if not (directory / MANIFEST_FILE).is_file():
            logger.warning("Resuming from %s, which has no %s (pre_manifest=True): its files are checked by "
                           "structure only.", directory, MANIFEST_FILE)
            return
        if skip_checksums:
            logger.warning("Resuming from %s without checking its files' checksums (skip_checkpoint_validation): "
                           "damaged bytes of the same size go unnoticed.", directory)
        verify_manifest(directory, checksums=not skip_checksums,
                        share=(collective.rank(), collective.world_size()))

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        return self.state.state_dict(group)
