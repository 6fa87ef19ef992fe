"""save / load / resume_from_checkpoint / get_state_dict of MegatronModel (TransformersModel's layout).

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
    capture_rng_state,
    check_finite,
    check_optimizer_state,
    check_rng_state,
    check_state_like,
    checkpoint_path,
    read_trainer_state,
    require_files,
    restore_rng_state,
    safe_torch_load,
    save_target,
    torch_save,
    write_trainer_state,
)
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.bridge.transfer import export_from
from twinkle_megatron.lora.peft_io import export_adapter, import_adapter, read_adapter
from twinkle_megatron.model import dist_ckpt
from twinkle_megatron.model.drivers import MegatronDriver, TorchDriver
from twinkle_megatron.model.hf_export import write_adapter_dir, write_full
from twinkle_megatron.model.loading import load_weights
from twinkle_megatron.model.shared_save import rank, shared_atomic_directory, world_size


def _rng_file() -> str:
    return RNG_FILE if world_size() == 1 else f"rng_state_{rank()}.pt"


def _optimizer_file() -> str:
    """The CPU stand-in's state is per rank under TP (each rank holds its shards)."""
    return OPTIMIZER_FILE if world_size() == 1 else f"optimizer_{rank()}.pt"


class CheckpointMixin:
    """Checkpoint half of the TwinkleModel API."""

    def save(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             save_optimizer: bool = False, consumed_train_samples: int = 0, overwrite: bool = False,
             allow_non_finite: bool = False, **kwargs: Any) -> str:
        """Write ``output_dir/name`` (default ``./output``) from every rank; returns its path.

        Replaces only a twinkle checkpoint of that name (or anything, with ``overwrite=True``);
        refuses NaN/inf trainable weights unless ``allow_non_finite=True``.
        """
        if kwargs:
            raise TypeError(f"save() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        final = save_target(name, output_dir, overwrite)
        if not allow_non_finite:
            check_finite(self._group_named_parameters(group), f"group {group.name!r}")
        with shared_atomic_directory(final, self.device) as tmp:
            if group.is_adapter:
                write_adapter_dir(self, group.name, tmp)
            else:
                write_full(self, tmp)
            if save_optimizer:
                self._save_training_state(group, tmp)
            if rank() == 0:
                tokenizer = getattr(group.template, "tokenizer", None)
                if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
                    tokenizer.save_pretrained(str(tmp))
                write_trainer_state(tmp, group.trainer_state(
                    consumed_train_samples, mixed_precision=self.mixed_precision,
                    has_optimizer_state=bool(save_optimizer), backend="megatron"))
        collective.barrier()  # rank 0 renames last: no rank returns a path that does not exist yet
        return str(final)

    def load(self, name: str, output_dir: str | None = None, *, adapter_name: str | None = None,
             **kwargs: Any) -> None:
        """Load weights saved by :meth:`save` (``name`` is a path when output_dir is None)."""
        if kwargs:
            raise TypeError(f"load() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        directory = checkpoint_path(name, output_dir) if output_dir is not None else Path(name).expanduser()
        self._load_weights(group, directory)

    def resume_from_checkpoint(self, checkpoint_dir: str, resume_only_model: bool = False, *,
                               adapter_name: str | None = None, **kwargs: Any) -> dict[str, int]:
        """Restore weights (+ optimizer, scheduler, RNG unless ``resume_only_model``) and progress."""
        if kwargs:
            raise TypeError(f"resume_from_checkpoint() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        directory = Path(checkpoint_dir).expanduser()
        require_files(directory, [], "checkpoint")
        progress = read_trainer_state(directory)
        restore = None if resume_only_model else self._read_training_state(group, directory)
        self._load_weights(group, directory)
        if restore is not None:
            self._apply_training_state(group, directory, restore)
        return group.restore_progress(progress)

    def get_state_dict(self, *, adapter_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """HF-named weights of this pipeline stage (full across TP): the adapter's (PEFT keys) or the model's."""
        if kwargs:
            raise TypeError(f"get_state_dict() got unexpected arguments {sorted(kwargs)}.")
        group = self._group(adapter_name)
        if group.is_adapter:
            return self._adapter_tensors(group.name)
        return export_from(self.gpt, self.args, self.layout)

    # -------------------------------------------------------------- internals
    def _adapter_tensors(self, adapter: str) -> dict[str, Any]:
        """The adapter's tensors under PEFT file keys (full across TP); MultiLoraMegatronModel slices a tenant's."""
        return export_adapter(self.gpt, adapter, self.args, self.layout)

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        if group.is_adapter:
            tensors, _ = read_adapter(directory)
            import_adapter(self.gpt, group.name, tensors, self.args, self.layout, str(directory))
        else:
            if (directory / "adapter_model.safetensors").is_file() and not (directory / "config.json").is_file():
                raise CheckpointError(f"{str(directory)!r} holds LoRA adapter weights but this group trains the "
                                      "full model; add_adapter_to_model(name, LoraConfig(...)) first and pass "
                                      "adapter_name=.")
            load_weights(self.gpt, str(directory), self.args, self.layout)
        if isinstance(group.optimizer, MegatronDriver):
            group.optimizer.optimizer.reload_model_params()  # fp32 main copies follow the new weights

    def _save_training_state(self, group: OptimizerGroup, directory: Path) -> None:
        driver = group.optimizer
        if isinstance(driver, MegatronDriver):
            dist_ckpt.save_optimizer(self, driver, directory)
        elif isinstance(driver, TorchDriver):
            torch_save(driver.state_dict(), directory / _optimizer_file())
        if group.lr_scheduler is not None and rank() == 0:
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
        restore["rng"] = safe_torch_load(directory / _rng_file())
        check_rng_state(restore["rng"], f"{str(directory / _rng_file())!r}")
        if isinstance(group.optimizer, MegatronDriver):
            if not dist_ckpt.has_optimizer(directory):
                raise CheckpointError(f"{str(directory)!r} has no {dist_ckpt.OPTIMIZER_DIR}/ (megatron optimizer "
                                      "state); it was saved without save_optimizer=True or by the CPU stand-in.")
            dist_ckpt.check_optimizer(directory)
        else:
            require_files(directory, [_optimizer_file()], "optimizer state")
            restore["optimizer"] = safe_torch_load(directory / _optimizer_file())
            _check_torch_state(group.optimizer, restore["optimizer"], directory)
        has_scheduler = (directory / SCHEDULER_FILE).is_file()
        if has_scheduler != (group.lr_scheduler is not None):
            raise RuntimeError(f"{str(directory)!r} {'has' if has_scheduler else 'has no'} lr scheduler state but "
                               f"group {group.name!r} {'has none' if has_scheduler else 'has one'}: make "
                               "set_lr_scheduler(...) match the saved run before resume_from_checkpoint.")
        if has_scheduler:
            restore["scheduler"] = safe_torch_load(directory / SCHEDULER_FILE)
            check_state_like(restore["scheduler"], group.lr_scheduler.state_dict(),
                             f"{str(directory / SCHEDULER_FILE)!r}", f"group {group.name!r}'s scheduler")
        return restore

    def _apply_training_state(self, group: OptimizerGroup, directory: Path, restore: dict[str, Any]) -> None:
        if isinstance(group.optimizer, MegatronDriver):
            dist_ckpt.load_optimizer(self, group.optimizer, directory)
        else:
            group.optimizer.load_state_dict(restore["optimizer"])
        if "scheduler" in restore:
            group.lr_scheduler.load_state_dict(restore["scheduler"])
        restore_rng_state(restore["rng"])


def _check_torch_state(driver: Any, state: Any, directory: Path) -> None:
    try:
        check_optimizer_state(driver.optimizer, state)
    except ValueError as exc:
        raise CheckpointError(f"{str(directory / OPTIMIZER_FILE)!r} does not fit this optimizer: {exc}.") from exc
