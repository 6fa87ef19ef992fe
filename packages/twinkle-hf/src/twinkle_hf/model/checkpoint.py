"""save / load / resume_from_checkpoint / get_state_dict of TransformersModel.

A checkpoint directory holds HF-loadable weights (a ``save_pretrained`` directory for the full
model, a flat PEFT adapter directory for LoRA), the tokenizer (the template's, else the model's own), and with
``save_optimizer=True`` the optimizer, scheduler, scaler and RNG states; ``trainer_state.json``
always. It is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle.checkpoint import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    PendingSave,
    atomic_directory,
    capture_rng_state,
    checkpoint_path,
    read_trainer_state,
    require_files,
    restore_rng_state,
    safe_torch_load,
    save_tokenizer,
    torch_save,
    write_trainer_state,
)
from twinkle.log import get_logger
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.model.optim import check_optimizer_state
from twinkle_hf.model.weights import (
    ADAPTER_WEIGHTS,
    adapter_state_dict,
    load_adapter_weights,
    load_full_weights,
    save_adapter,
    save_full,
    write_adapter,
)

logger = get_logger("twinkle_hf")


class CheckpointMixin:
    """Checkpoint half of the TwinkleModel API."""

    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             save_optimizer: bool = False, consumed_train_samples: int = 0, async_save: bool = False,
             **kwargs: Any) -> str | PendingSave:
        """Write ``output_dir/name`` (``output_dir`` defaults to ``./output``) and return its path.

        ``async_save=True`` returns a :class:`twinkle.checkpoint.PendingSave` at once: the weights
        and optimizer state are copied to host memory and written by torch.distributed.checkpoint's
        ``async_save`` while training goes on (the sharded layout, on one process too); the HF-loadable
        weights, tokenizer and small files are written now. ``pending.wait()`` (every rank) puts the
        directory under its final name; until then it exists only under a temporary one.
        """
        if kwargs:
            raise TypeError(f"save() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        final = checkpoint_path(name, output_dir)
        if save_optimizer and group.micro_step:
            logger.warning("Saving group %r in the middle of gradient accumulation (%d of %d micro-batches): the "
                           "pending gradients are not saved.", group.name, group.micro_step,
                           group.gradient_accumulation_steps)
        if self.dist_plan.distributed or async_save:
            return self._save_distributed(group, final, save_optimizer, consumed_train_samples, async_save)
        with atomic_directory(final) as tmp:
            self._save_weights(group, tmp)
            if save_optimizer:
                self._save_training_state(group, tmp)
            write_trainer_state(tmp, group.trainer_state(consumed_train_samples, mixed_precision=self.mixed_precision,
                                                         has_optimizer_state=bool(save_optimizer)))
        return str(final)

    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> None:
        """Load weights saved by :meth:`save` into the group (``name`` is a path when output_dir is None)."""
        if kwargs:
            raise TypeError(f"load() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        if self.dist_plan.distributed and self._wrapped:
            from twinkle_hf.distributed.checkpoint import load_export

            load_export(self, group, directory)
            return
        self._load_weights(group, directory)

    def resume_from_checkpoint(self, checkpoint_dir: str, resume_only_model: bool = False, *,
                               adapter_name: str | None = None, **kwargs: Any) -> dict[str, int]:
        """Restore weights (+ optimizer, scheduler, scaler, RNG unless ``resume_only_model``) and progress.

        Every file is read and checked before anything is changed.
        """
        if kwargs:
            raise TypeError(f"resume_from_checkpoint() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        directory = Path(checkpoint_dir).expanduser()
        require_files(directory, [], "checkpoint")
        state = read_trainer_state(directory)
        from twinkle_hf.distributed.checkpoint import is_sharded, load_sharded

        if self.dist_plan.distributed or is_sharded(directory):  # sharded, or an async save
            self._ensure_wrapped()

            load_sharded(self, group, directory, with_training_state=not resume_only_model)
            return group.restore_progress(state)
        restore = None if resume_only_model else self._read_training_state(group, directory)
        self._load_weights(group, directory)
        if restore is not None:
            self._apply_training_state(group, restore)
        return group.restore_progress(state)

    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The group's weights: the adapter's (PEFT file keys) or the full model's ``state_dict``."""
        if kwargs:
            raise TypeError(f"get_state_dict() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        state = adapter_state_dict(self.model, group.name) if group.is_adapter else self._hf_model().state_dict()
        if self.dist_plan.sharded:  # full tensors, gathered from the shards (every rank takes part)
            from twinkle_hf.distributed.checkpoint import gathered_state

            return gathered_state(state)
        return state

    # -------------------------------------------------------------- internals
    def _save_distributed(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                          consumed_train_samples: int, async_save: bool = False) -> str | PendingSave:
        """Every rank takes part: DCP shards from all, the HF export and small files from rank 0."""
        from twinkle_hf.distributed import checkpoint as dist_ckpt
        from twinkle_hf.distributed.comm import rank

        self._ensure_wrapped()
        tmp = dist_ckpt.shared_temporary(final)
        try:
            if group.is_adapter:
                state = dist_ckpt.gathered_state(adapter_state_dict(self.model, group.name))
                if rank() == 0:
                    write_adapter(self.model, group.name, state, tmp)
            else:
                dist_ckpt.save_full_export(self._hf_model(), tmp)
            futures = dist_ckpt.save_sharded(self, group, tmp, save_optimizer, async_save=async_save)
            if rank() == 0:
                save_tokenizer(tmp, group.template, self.model_path)
                write_trainer_state(tmp, group.trainer_state(
                    consumed_train_samples, mixed_precision=self.mixed_precision,
                    has_optimizer_state=bool(save_optimizer), world_size=self.dist_plan.world_size,
                    strategy=self.dist_plan.kind))
        except BaseException:
            dist_ckpt.shared_commit(tmp, final, ok=False)
            raise
        pending = PendingSave(str(final), futures, lambda: dist_ckpt.shared_commit(tmp, final))
        return pending if async_save else pending.wait()

    def _save_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            save_adapter(self.model, group.name, directory)
        else:
            save_full(self._hf_model(), directory)
        save_tokenizer(directory, group.template, self.model_path)

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            load_adapter_weights(self.model, group.name, directory)
        else:
            if (directory / ADAPTER_WEIGHTS).is_file() and not any(directory.glob("model*.safetensors")):
                raise CheckpointError(
                    f"{str(directory)!r} holds LoRA adapter weights but this model trains the full model; "
                    "add_adapter_to_model(name, LoraConfig(...)) first and pass adapter_name=."
                )
            load_full_weights(self._hf_model(), directory)

    def _save_training_state(self, group: OptimizerGroup, directory: Path) -> None:
        if group.optimizer is not None:
            torch_save(group.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        if group.lr_scheduler is not None:
            torch_save(group.lr_scheduler.state_dict(), directory / SCHEDULER_FILE)
        if group.scaler is not None:
            torch_save(group.scaler.state_dict(), directory / SCALER_FILE)
        torch_save(capture_rng_state(), directory / RNG_FILE)

    def _read_training_state(self, group: OptimizerGroup, directory: Path) -> dict[str, Any]:
        """Load and check every training-state file; nothing is applied yet."""
        if group.optimizer is None:
            raise RuntimeError(f"resume_from_checkpoint restores the optimizer of group {group.name!r}, which has "
                               "none: call set_optimizer (and set_lr_scheduler) first, or pass "
                               "resume_only_model=True.")
        require_files(directory, [OPTIMIZER_FILE, RNG_FILE], "optimizer and RNG state for an exact resume")
        restore: dict[str, Any] = {"optimizer": safe_torch_load(directory / OPTIMIZER_FILE),
                                   "rng": safe_torch_load(directory / RNG_FILE)}
        try:
            check_optimizer_state(group.optimizer, restore["optimizer"])
        except ValueError as exc:
            raise CheckpointError(f"{str(directory / OPTIMIZER_FILE)!r} does not fit group {group.name!r}'s "
                                  f"optimizer: {exc}.") from exc
        has_scheduler = (directory / SCHEDULER_FILE).is_file()
        if has_scheduler and group.lr_scheduler is None:
            raise RuntimeError(f"{str(directory)!r} has an lr scheduler state but group {group.name!r} has no "
                               "scheduler: call set_lr_scheduler(...) before resume_from_checkpoint.")
        if group.lr_scheduler is not None:
            require_files(directory, [SCHEDULER_FILE], "lr scheduler state")
            restore["scheduler"] = safe_torch_load(directory / SCHEDULER_FILE)
        if group.scaler is not None:
            require_files(directory, [SCALER_FILE], "fp16 GradScaler state")
            restore["scaler"] = safe_torch_load(directory / SCALER_FILE)
        return restore

    def _apply_training_state(self, group: OptimizerGroup, restore: dict[str, Any]) -> None:
        group.optimizer.load_state_dict(restore["optimizer"])
        if "scheduler" in restore:
            group.lr_scheduler.load_state_dict(restore["scheduler"])
        if "scaler" in restore:
            group.scaler.load_state_dict(restore["scaler"])
        restore_rng_state(restore["rng"])
