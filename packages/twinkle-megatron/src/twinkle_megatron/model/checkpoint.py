"""A MegatronModel's model and optimizer state in a checkpoint (``twinkle.checkpoint.manager.CheckpointState``).

Weights are HF-loadable (``save_pretrained`` layout, or a flat PEFT adapter directory), gathered over TP
(``hf_export.py``). The optimizer is ``optimizer.pt`` for the CPU stand-in (``optimizer_<rank>.pt`` per
rank under TP: each holds its shards), or the dist-checkpoint directory ``optimizer_dist/`` that every
rank writes for megatron's distributed optimizer (``dist_ckpt.py``). Each rank's RNG file is
``rng_state_<rank>.pt`` (``rng_state.pt`` on one process). Everything else -- the directory, the side
files, the manifest, the ranks' agreement -- is the checkpoint manager's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import (
    OPTIMIZER_FILE,
    RNG_FILE,
    CheckpointError,
    check_optimizer_state,
    require_files,
    safe_torch_load,
    torch_save,
)
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.bridge.transfer import export_from
from twinkle_megatron.model import dist_ckpt
from twinkle_megatron.model.drivers import MegatronDriver, TorchDriver
from twinkle_megatron.model.hf_export import write_adapter_dir, write_full
from twinkle_megatron.model.loading import load_weights


def _optimizer_file() -> str:
    """The CPU stand-in's state is per rank under TP (each rank holds its shards)."""
    return OPTIMIZER_FILE if collective.world_size() == 1 else f"optimizer_{collective.rank()}.pt"


class MegatronCheckpointState:
    """The files of a :class:`~twinkle_megatron.model.backend.MegatronBackend`'s checkpoints (every rank writes)."""

    supports_async = False

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.model_path: str | None = backend.model_path

    def rng_file(self, rank: int, world_size: int) -> str:
        return RNG_FILE if world_size == 1 else f"rng_state_{rank}.pt"

    def trainer_fields(self, async_save: bool) -> dict[str, Any]:
        return {"mixed_precision": self.backend.mixed_precision, "backend": "megatron"}

    def write(self, group: OptimizerGroup, directory: Path, save_optimizer: bool, async_save: bool) -> list:
        backend = self.backend
        if group.is_adapter:
            config, suffixes = backend.adapters.peft_config(group)
            write_adapter_dir(backend, backend.adapters.state_dict(group), config, suffixes, directory)
        else:
            write_full(backend, directory)
        if save_optimizer and isinstance(group.optimizer, MegatronDriver):
            dist_ckpt.save_optimizer(group.optimizer, directory)
        elif save_optimizer and isinstance(group.optimizer, TorchDriver):
            torch_save(group.optimizer.state_dict(), directory / _optimizer_file())
        return []

    def read(self, group: OptimizerGroup, directory: Path, with_optimizer: bool) -> dict[str, Any]:
        """The weights are checked as they load; the optimizer state here (``None``: megatron's, in apply)."""
        if not with_optimizer:
            return {}
        if isinstance(group.optimizer, MegatronDriver):
            if not dist_ckpt.has_optimizer(directory):
                raise CheckpointError(f"{str(directory)!r} has no {dist_ckpt.OPTIMIZER_DIR}/ (megatron optimizer "
                                      "state); it was saved without save_optimizer=True or by the CPU stand-in.")
            dist_ckpt.check_optimizer(directory)
            return {"optimizer": None}
        path = require_files(directory, [_optimizer_file()], "optimizer state") / _optimizer_file()
        state = safe_torch_load(path)
        try:
            check_optimizer_state(group.optimizer.optimizer, state)
        except ValueError as exc:
            raise CheckpointError(f"{str(path)!r} does not fit this optimizer: {exc}.") from exc
        return {"optimizer": state}

    def apply(self, group: OptimizerGroup, directory: Path, staged: dict[str, Any]) -> None:
        self.load(group, directory)
        if "optimizer" not in staged:
            return
        if isinstance(group.optimizer, MegatronDriver):
            dist_ckpt.load_optimizer(group.optimizer, directory)
        else:
            group.optimizer.load_state_dict(staged["optimizer"])

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

    def trainable_tensors(self, group: OptimizerGroup) -> Any:
        return self.backend.adapters.named_parameters(group)

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        """HF-named weights of this pipeline stage (full across TP): the adapter's (PEFT keys) or the model's."""
        backend = self.backend
        if group.is_adapter:
            return backend.adapters.state_dict(group)
        return export_from(backend.gpt, backend.args, backend.layout)
