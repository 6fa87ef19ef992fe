"""How TransformersModel writes and reads checkpoints (the public save/load/resume are core's).

A checkpoint directory holds HF-loadable weights (a ``save_pretrained`` directory for the full
model, a flat PEFT adapter directory for LoRA), the tokenizer (the template's, a VL template's
processor, else the model's own), and with
``save_optimizer=True`` the optimizer, scheduler, scaler and RNG states; ``trainer_state.json``
always. It is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    PendingSave,
    apply_side_states,
    atomic_directory,
    capture_rng_state,
    read_side_states,
    require_files,
    safe_torch_load,
    shared_commit,
    shared_temporary,
    torch_save,
    write_trainer_state,
)
from twinkle.model.checkpointing import CheckpointMixin as CoreCheckpointMixin
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


class CheckpointMixin(CoreCheckpointMixin):
    """How TransformersModel writes and reads its checkpoint files; the public methods are core's."""

    supports_async_save = True

    def _write_checkpoint(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                          consumed_train_samples: int) -> None:
        if self.dist_plan.distributed:
            self._save_distributed(group, final, save_optimizer, consumed_train_samples).wait()
            return
        with atomic_directory(final) as tmp:
            self._save_weights(group, tmp)
            if save_optimizer:
                self._save_training_state(group, tmp)
            write_trainer_state(tmp, group.trainer_state(consumed_train_samples, mixed_precision=self.mixed_precision,
                                                         has_optimizer_state=bool(save_optimizer)))

    def _write_checkpoint_async(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                                consumed_train_samples: int) -> PendingSave:
        """Weights and optimizer go to DCP's ``async_save`` (the sharded layout, on one process too)."""
        return self._save_distributed(group, final, save_optimizer, consumed_train_samples, async_save=True)

    def _load_checkpoint(self, group: OptimizerGroup, directory: Path) -> None:
        if self.dist_plan.distributed and self._wrapped:
            from twinkle_hf.distributed.checkpoint import load_export

            load_export(self, group, directory)
            return
        if self._weights_dir is not None and not group.is_adapter:  # not sharded yet: read the shards from here
            from twinkle_hf.model.meta import missing_from_files
            from twinkle_hf.model.weights import weight_files

            keys = weight_files(directory)
            missing = missing_from_files(self._hf_model(), keys or {})
            if keys is None or missing:
                raise CheckpointError(f"{str(directory)!r} holds no safetensors weights for this model (missing e.g. "
                                      f"{missing[:3]}); load() takes a directory written by save() or "
                                      "save_pretrained().")
            self._weights_dir = str(directory)
            return
        self._load_weights(group, directory)

    def _resume_weights(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> None:
        from twinkle_hf.distributed.checkpoint import is_sharded, load_sharded

        if self.dist_plan.distributed or is_sharded(directory):  # sharded, or an async save
            self._ensure_wrapped()
            load_sharded(self, group, directory, with_training_state=not resume_only_model)
            return
        restore = None if resume_only_model else self._read_training_state(group, directory)
        self._load_weights(group, directory)
        if restore is not None:
            self._apply_training_state(group, restore)

    def _trainable_tensors(self, group: OptimizerGroup) -> Any:
        from twinkle_hf.distributed.checkpoint import trainable_params

        self._materialize()
        return trainable_params(self, group).items()

    def _state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        self._materialize()
        state = adapter_state_dict(self.model, group.name) if group.is_adapter else self._hf_model().state_dict()
        if self.dist_plan.sharded:  # full tensors, gathered from the shards (every rank takes part)
            from twinkle_hf.distributed.checkpoint import gathered_state

            return gathered_state(state)
        return state

    # -------------------------------------------------------------- internals
    def _materialize(self) -> None:
        """Built on the meta device (FSDP2 sharded loading): the weights exist once wrapped and filled."""
        if self._weights_dir is not None:
            self._ensure_wrapped()

    def _save_distributed(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                          consumed_train_samples: int, async_save: bool = False) -> PendingSave:
        """Every rank takes part: DCP shards from all, the HF export and small files from rank 0."""
        from twinkle_hf.distributed import checkpoint as dist_ckpt

        self._ensure_wrapped()
        tmp = shared_temporary(final)
        try:
            if group.is_adapter:
                state = dist_ckpt.gathered_state(adapter_state_dict(self.model, group.name))
                if collective.rank() == 0:
                    write_adapter(self.model, group.name, state, tmp)
            else:
                dist_ckpt.save_full_export(self._hf_model(), tmp)
            futures = dist_ckpt.save_sharded(self, group, tmp, save_optimizer, async_save=async_save)
            if collective.rank() == 0:
                self._save_preprocessing(group, tmp)
                write_trainer_state(tmp, group.trainer_state(
                    consumed_train_samples, mixed_precision=self.mixed_precision,
                    has_optimizer_state=bool(save_optimizer), world_size=self.dist_plan.world_size,
                    strategy=self.dist_plan.kind))
        except BaseException:
            shared_commit(tmp, final, ok=False)
            raise
        return PendingSave(str(final), futures, lambda ok: shared_commit(tmp, final, ok))

    def _save_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            save_adapter(self.model, group.name, directory)
        else:
            save_full(self._hf_model(), directory)
        self._save_preprocessing(group, directory)

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
        optimizer = safe_torch_load(directory / OPTIMIZER_FILE)
        try:
            check_optimizer_state(group.optimizer, optimizer)
        except ValueError as exc:
            raise CheckpointError(f"{str(directory / OPTIMIZER_FILE)!r} does not fit group {group.name!r}'s "
                                  f"optimizer: {exc}.") from exc
        has_scheduler = (directory / SCHEDULER_FILE).is_file()
        if has_scheduler and group.lr_scheduler is None:
            raise RuntimeError(f"{str(directory)!r} has an lr scheduler state but group {group.name!r} has no "
                               "scheduler: call set_lr_scheduler(...) before resume_from_checkpoint.")
        return {"optimizer": optimizer, **read_side_states(directory, group, directory / RNG_FILE)}

    def _apply_training_state(self, group: OptimizerGroup, restore: dict[str, Any]) -> None:
        group.optimizer.load_state_dict(restore["optimizer"])
        apply_side_states(group, restore)
