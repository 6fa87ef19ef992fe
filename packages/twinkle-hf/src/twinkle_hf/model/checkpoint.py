"""How TransformersModel writes and reads checkpoint files (``twinkle.checkpoint.manager.CheckpointState``).

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
from twinkle.checkpoint.tokenizer import save_tokenizer
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.model.optim import check_optimizer_state
from twinkle_hf.model.weights import (
    ADAPTER_WEIGHTS,
    load_full_weights,
    save_full,
)


class HFCheckpointState:
    """The files of an :class:`~twinkle_hf.model.backend.HFBackend`'s checkpoints: one process, sharded, async."""

    def __init__(self, backend: Any, supports_async: bool = True) -> None:
        self.backend = backend
        self.supports_async = supports_async

    def write(self, group: OptimizerGroup, final: Path, save_optimizer: bool, consumed_train_samples: int) -> None:
        if self.backend.dist_plan.distributed:
            self._save_distributed(group, final, save_optimizer, consumed_train_samples).wait()
            return
        with atomic_directory(final) as tmp:
            self._save_weights(group, tmp)
            if save_optimizer:
                self._save_training_state(group, tmp)
            write_trainer_state(tmp, group.trainer_state(consumed_train_samples,
                                                         mixed_precision=self.backend.mixed_precision,
                                                         has_optimizer_state=bool(save_optimizer)))

    def write_async(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                    consumed_train_samples: int) -> PendingSave:
        """Weights and optimizer go to DCP's ``async_save`` (the sharded layout, on one process too)."""
        return self._save_distributed(group, final, save_optimizer, consumed_train_samples, async_save=True)

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        backend = self.backend
        if group.is_adapter:
            backend.adapters.load(group, directory)
            return
        if backend.dist_plan.distributed and backend.wrapped:
            from twinkle_hf.distributed.checkpoint import load_export

            load_export(backend, group, directory)
            return
        if backend.weights_dir is not None:  # not sharded yet: read the shards from here
            from twinkle_hf.model.meta import missing_from_files
            from twinkle_hf.model.weights import weight_files

            keys = weight_files(directory)
            missing = missing_from_files(backend.hf_model(), keys or {})
            if keys is None or missing:
                raise CheckpointError(f"{str(directory)!r} holds no safetensors weights for this model (missing e.g. "
                                      f"{missing[:3]}); load() takes a directory written by save() or "
                                      "save_pretrained().")
            backend.weights_dir = str(directory)
            return
        self._load_weights(group, directory)

    def resume(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> None:
        from twinkle_hf.distributed.checkpoint import is_sharded, load_sharded

        backend = self.backend
        if backend.dist_plan.distributed or is_sharded(directory):  # sharded, or an async save
            self._require_wrapped("resume_from_checkpoint")
            load_sharded(backend, group, directory, with_training_state=not resume_only_model)
            return
        restore = None if resume_only_model else self._read_training_state(group, directory)
        self._load_weights(group, directory)
        if restore is not None:
            self._apply_training_state(group, restore)

    def trainable_tensors(self, group: OptimizerGroup) -> Any:
        from twinkle_hf.distributed.checkpoint import trainable_params

        self._require_materialized("save")
        return trainable_params(self.backend, group).items()

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        backend = self.backend
        self._require_materialized("get_state_dict")
        state = backend.adapters.state_dict(group) if group.is_adapter else backend.hf_model().state_dict()
        if backend.dist_plan.sharded:  # full tensors, gathered from the shards (every rank takes part)
            from twinkle_hf.distributed.checkpoint import gathered_state

            return gathered_state(state)
        return state

    # -------------------------------------------------------------- internals
    def _require_materialized(self, what: str) -> None:
        """Built on the meta device (FSDP2 sharded loading): the weights exist once the model is parallelized."""
        if not self.backend.materialized():
            self._require_wrapped(what)

    def _require_wrapped(self, what: str) -> None:
        if self.backend.dist_plan.distributed and not self.backend.wrapped:
            raise RuntimeError(f"{what} on a distributed model before it was wrapped: call set_optimizer(...) (or "
                               "model.parallelize()) first; each rank holds its weights once the model is sharded.")

    def _save_distributed(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                          consumed_train_samples: int, async_save: bool = False) -> PendingSave:
        """Every rank takes part: DCP shards from all, the HF export and small files from rank 0."""
        from twinkle_hf.distributed import checkpoint as dist_ckpt

        backend = self.backend
        self._require_wrapped("save")
        tmp = shared_temporary(final)
        try:
            if group.is_adapter:
                state = dist_ckpt.gathered_state(backend.adapters.state_dict(group))
                if collective.rank() == 0:
                    backend.adapters.write(group, state, tmp)
            else:
                dist_ckpt.save_full_export(backend.hf_model(), tmp)
            futures = dist_ckpt.save_sharded(backend, group, tmp, save_optimizer, async_save=async_save)
            if collective.rank() == 0:
                self._save_preprocessing(group, tmp)
                write_trainer_state(tmp, group.trainer_state(
                    consumed_train_samples, mixed_precision=backend.mixed_precision,
                    has_optimizer_state=bool(save_optimizer), world_size=backend.dist_plan.world_size,
                    strategy=backend.dist_plan.kind))
        except BaseException:
            shared_commit(tmp, final, ok=False)
            raise
        return PendingSave(str(final), futures, lambda ok: shared_commit(tmp, final, ok))

    def _save_preprocessing(self, group: OptimizerGroup, directory: Path) -> bool:
        """What encodes like the group's template beside the weights (its tokenizer; a VL template: its
        processor), else the tokenizer/processor files of the directory the model came from."""
        return save_tokenizer(directory, group.template, self.backend.model_path)

    def _save_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            adapters = self.backend.adapters
            adapters.write(group, adapters.state_dict(group), directory)
        else:
            save_full(self.backend.hf_model(), directory)
        self._save_preprocessing(group, directory)

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            self.backend.adapters.load(group, directory)
        else:
            if (directory / ADAPTER_WEIGHTS).is_file() and not any(directory.glob("model*.safetensors")):
                raise CheckpointError(
                    f"{str(directory)!r} holds LoRA adapter weights but this model trains the full model; "
                    "add_adapter_to_model(name, LoraConfig(...)) first and pass adapter_name=."
                )
            load_full_weights(self.backend.hf_model(), directory)

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
