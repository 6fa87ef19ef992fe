"""How MegatronModel writes and reads checkpoint files (``twinkle.checkpoint.manager.CheckpointState``).

A checkpoint directory holds HF-loadable weights (``save_pretrained`` layout, or a flat PEFT adapter
directory), the tokenizer when a template has one, ``trainer_state.json`` always and, with
``save_optimizer=True``: ``scheduler.pt``, the RNG state, and the optimizer -- ``optimizer.pt`` for
the CPU stand-in, the dist-checkpoint directory ``optimizer_dist/`` for megatron's distributed
optimizer. Every rank takes part (TP gathers, sharded optimizer); one rank renames the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    PendingSave,
    apply_side_states,
    capture_rng_state,
    check_optimizer_state,
    read_side_states,
    require_files,
    safe_torch_load,
    shared_atomic_directory,
    torch_save,
    write_trainer_state,
)
from twinkle.checkpoint.tokenizer import save_tokenizer
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.bridge.transfer import export_from
from twinkle_megatron.model import dist_ckpt
from twinkle_megatron.model.drivers import MegatronDriver, TorchDriver
from twinkle_megatron.model.hf_export import write_adapter_dir, write_full
from twinkle_megatron.model.loading import load_weights


def _rng_file() -> str:
    return RNG_FILE if collective.world_size() == 1 else f"rng_state_{collective.rank()}.pt"


def _optimizer_file() -> str:
    """The CPU stand-in's state is per rank under TP (each rank holds its shards)."""
    return OPTIMIZER_FILE if collective.world_size() == 1 else f"optimizer_{collective.rank()}.pt"


class MegatronCheckpointState:
    """The files of a :class:`~twinkle_megatron.model.backend.MegatronBackend`'s checkpoints (every rank writes)."""

    supports_async = False

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def write(self, group: OptimizerGroup, final: Path, save_optimizer: bool, consumed_train_samples: int) -> None:
        """Every rank writes into one shared temporary directory (TP gathers, sharded optimizer)."""
        backend = self.backend
        with shared_atomic_directory(final) as tmp:
            if group.is_adapter:
                config, suffixes = backend.adapters.peft_config(group)
                write_adapter_dir(backend, backend.adapters.state_dict(group), config, suffixes, tmp)
            else:
                write_full(backend, tmp)
            if save_optimizer:
                self._save_training_state(group, tmp)
            if collective.rank() == 0:
                save_tokenizer(tmp, group.template, backend.model_path)
                write_trainer_state(tmp, group.trainer_state(
                    consumed_train_samples, mixed_precision=backend.mixed_precision,
                    has_optimizer_state=bool(save_optimizer), backend="megatron"))

    def write_async(self, group: OptimizerGroup, final: Path, save_optimizer: bool,
                    consumed_train_samples: int) -> PendingSave:
        raise NotImplementedError("MegatronModel saves synchronously (supports_async is False).")

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        backend = self.backend
        if group.is_adapter:
            backend.adapters.load(group, directory)
        else:
            if (directory / "adapter_model.safetensors").is_file() and not (directory / "config.json").is_file():
                raise CheckpointError(f"{str(directory)!r} holds LoRA adapter weights but this group trains the "
                                      "full model; add_adapter_to_model(name, LoraConfig(...)) first and pass "
                                      "adapter_name=.")
            load_weights(backend.gpt, str(directory), backend.args, backend.layout)
        if isinstance(group.optimizer, MegatronDriver):
            group.optimizer.optimizer.reload_model_params()  # fp32 main copies follow the new weights

    def resume(self, group: OptimizerGroup, directory: Path, resume_only_model: bool) -> None:
        restore = None if resume_only_model else self._read_training_state(group, directory)
        self.load(group, directory)
        if restore is not None:
            self._apply_training_state(group, directory, restore)

    def trainable_tensors(self, group: OptimizerGroup) -> Any:
        return self.backend.adapters.named_parameters(group)

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """HF-named weights of this pipeline stage (full across TP): the adapter's (PEFT keys) or the model's."""
        backend = self.backend
        if group.is_adapter:
            return backend.adapters.state_dict(group)
        return export_from(backend.gpt, backend.args, backend.layout)

    # -------------------------------------------------------------- internals
    def _save_training_state(self, group: OptimizerGroup, directory: Path) -> None:
        driver = group.optimizer
        if isinstance(driver, MegatronDriver):
            dist_ckpt.save_optimizer(driver, directory)
        elif isinstance(driver, TorchDriver):
            torch_save(driver.state_dict(), directory / _optimizer_file())
        if group.lr_scheduler is not None and collective.rank() == 0:
            torch_save(group.lr_scheduler.state_dict(), directory / SCHEDULER_FILE)
        torch_save(capture_rng_state(), directory / _rng_file())

    def _read_training_state(self, group: OptimizerGroup, directory: Path) -> dict[str, Any]:
        """Read and check every side file before anything is changed."""
        if group.optimizer is None:
            raise RuntimeError(f"resume_from_checkpoint restores the optimizer of group {group.name!r}, which has "
                               "none: call set_optimizer('default', ...) (and set_lr_scheduler) first, or pass "
                               "resume_only_model=True.")
        restore: dict[str, Any] = {}
        require_files(directory, [_rng_file()], "RNG state for an exact resume")
        if isinstance(group.optimizer, MegatronDriver):
            if not dist_ckpt.has_optimizer(directory):
                raise CheckpointError(f"{str(directory)!r} has no {dist_ckpt.OPTIMIZER_DIR}/ (megatron optimizer "
                                      "state); it was saved without save_optimizer=True or by the CPU stand-in.")
            dist_ckpt.check_optimizer(directory)
        else:
            path = directory / _optimizer_file()
            require_files(directory, [_optimizer_file()], "optimizer state")
            restore["optimizer"] = safe_torch_load(path)
            try:
                check_optimizer_state(group.optimizer.optimizer, restore["optimizer"])
            except ValueError as exc:
                raise CheckpointError(f"{str(path)!r} does not fit this optimizer: {exc}.") from exc
        has_scheduler = (directory / SCHEDULER_FILE).is_file()
        if has_scheduler != (group.lr_scheduler is not None):
            raise RuntimeError(f"{str(directory)!r} {'has' if has_scheduler else 'has no'} lr scheduler state but "
                               f"group {group.name!r} {'has none' if has_scheduler else 'has one'}: make "
                               "set_lr_scheduler(...) match the saved run before resume_from_checkpoint.")
        return {**restore, **read_side_states(directory, group, directory / _rng_file())}

    def _apply_training_state(self, group: OptimizerGroup, directory: Path, restore: dict[str, Any]) -> None:
        if isinstance(group.optimizer, MegatronDriver):
            dist_ckpt.load_optimizer(group.optimizer, directory)
        else:
            group.optimizer.load_state_dict(restore["optimizer"])
        apply_side_states(group, restore)
