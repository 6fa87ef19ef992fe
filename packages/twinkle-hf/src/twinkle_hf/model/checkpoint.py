"""A TransformersModel's model and optimizer state in a checkpoint (``twinkle.checkpoint.manager.CheckpointState``).

Weights are HF-loadable: a ``save_pretrained`` directory for the full model, a flat PEFT adapter directory
for LoRA. On one process the optimizer state is ``optimizer.pt``. A distributed model, and an asynchronous
save on any number of processes, also writes torch.distributed.checkpoint shards
(``twinkle_hf.distributed.checkpoint``: ``dcp_model/`` + ``dcp_optimizer/``, or ``dcp_state/``), from which
such a checkpoint resumes. The manager writes and reads everything else (RNG, scheduler, scaler,
tokenizer, trainer state, manifest) and owns the directory.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import OPTIMIZER_FILE, RNG_FILE, CheckpointError, require_files, safe_torch_load, torch_save
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.distributed import checkpoint as dist_ckpt
from twinkle_hf.model.optim import check_optimizer_state
from twinkle_hf.model.weights import ADAPTER_WEIGHTS, load_full_weights, save_full, weight_files


class HFCheckpointState:
    """The files of an :class:`~twinkle_hf.model.backend.HFBackend`'s checkpoints: one process, sharded, async."""

    def __init__(self, backend: Any, supports_async: bool = True) -> None:
        self.backend = backend
        self.supports_async = supports_async
        self.model_path: str | None = backend.model_path

    def rng_file(self, rank: int, world_size: int) -> str:
        """Rank 0 keeps the single-process name; the other ranks' generators sit beside it."""
        return RNG_FILE if rank == 0 else RNG_FILE.replace(".pt", f".rank{rank}.pt")

    def trainer_fields(self, async_save: bool) -> dict[str, Any]:
        plan = self.backend.dist_plan
        sharded = {"world_size": plan.world_size, "strategy": plan.kind} if plan.distributed or async_save else {}
        return {"mixed_precision": self.backend.mixed_precision, **sharded}

    # -------------------------------------------------------------------- saving
    def write(self, group: OptimizerGroup, directory: Path, save_optimizer: bool,
              async_save: bool) -> list[Future]:
        backend = self.backend
        sharded = backend.dist_plan.distributed or async_save
        if sharded:
            self._require_wrapped("save")
        if group.is_adapter:  # small: gathered whole (a collective when sharded) and written by rank 0
            state = dist_ckpt.gathered_state(backend.adapters.state_dict(group))
            if collective.rank() == 0:
                backend.adapters.write(group, state, directory)
        elif sharded:
            dist_ckpt.save_full_export(backend.hf_model(), directory)
        else:
            save_full(backend.hf_model(), directory)
        if sharded:
            return dist_ckpt.save_sharded(backend, group, directory, save_optimizer, async_save=async_save)
        if save_optimizer and group.optimizer is not None:
            torch_save(group.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        return []

    # ------------------------------------------------------------------- reading
    def read(self, group: OptimizerGroup, directory: Path, with_optimizer: bool) -> Any:
        if self._reads_shards(directory):
            self._require_wrapped("resume_from_checkpoint")
            return dist_ckpt.read_sharded(self.backend, group, directory, with_optimizer)
        self._check_weights(group, directory)
        if not with_optimizer:
            return None
        require_files(directory, [OPTIMIZER_FILE], "optimizer state")
        optimizer = safe_torch_load(directory / OPTIMIZER_FILE)
        try:
            check_optimizer_state(group.optimizer, optimizer)
        except ValueError as exc:
            raise CheckpointError(f"{str(directory / OPTIMIZER_FILE)!r} does not fit group {group.name!r}'s "
                                  f"optimizer: {exc}.") from exc
        return optimizer

    def apply(self, group: OptimizerGroup, directory: Path, staged: Any) -> None:
        if self._reads_shards(directory):
            dist_ckpt.apply_sharded(self.backend, group, directory, staged)
            return
        self._load_weights(group, directory)
        if staged is not None:
            group.optimizer.load_state_dict(staged)

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        backend = self.backend
        if group.is_adapter:
            backend.adapters.load(group, directory)
        elif backend.dist_plan.distributed and backend.wrapped:
            dist_ckpt.load_export(backend, group, directory)
        elif backend.weights_dir is not None:  # not sharded yet: read the shards from here
            from twinkle_hf.model.meta import missing_from_files

            keys = weight_files(directory)
            missing = missing_from_files(backend.hf_model(), keys or {})
            if keys is None or missing:
                raise CheckpointError(f"{str(directory)!r} holds no safetensors weights for this model (missing e.g. "
                                      f"{missing[:3]}); load() takes a directory written by save() or "
                                      "save_pretrained().")
            backend.weights_dir = str(directory)
        else:
            self._load_weights(group, directory)

    def trainable_tensors(self, group: OptimizerGroup) -> Any:
        self._require_materialized("save")
        return dist_ckpt.trainable_params(self.backend, group).items()

    def state_dict(self, group: OptimizerGroup) -> dict[str, Any]:
        backend = self.backend
        self._require_materialized("get_state_dict")
        state = backend.adapters.state_dict(group) if group.is_adapter else backend.hf_model().state_dict()
        if backend.dist_plan.sharded or backend.dist_plan.tensor_parallel:  # full tensors, gathered (every rank)
            return dist_ckpt.gathered_state(state)
        return state

    # -------------------------------------------------------------- internals
    def _reads_shards(self, directory: Path) -> bool:
        """A distributed model resumes from its shards; so does any model from an asynchronous save's."""
        return self.backend.dist_plan.distributed or dist_ckpt.is_sharded(directory)

    def _require_materialized(self, what: str) -> None:
        """Built on the meta device (FSDP2 sharded loading): the weights exist once the model is parallelized."""
        if not self.backend.materialized():
            self._require_wrapped(what)

    def _require_wrapped(self, what: str) -> None:
        if self.backend.dist_plan.distributed and not self.backend.wrapped:
            raise RuntimeError(f"{what} on a distributed model before it was wrapped: call set_optimizer(...) (or "
                               "model.parallelize()) first; each rank holds its weights once the model is sharded.")

    def _check_weights(self, group: OptimizerGroup, directory: Path) -> None:
        """The directory holds weights of the group's kind (keys and shapes are checked as they load)."""
        if group.is_adapter:
            if not (directory / ADAPTER_WEIGHTS).is_file():
                raise CheckpointError(f"{str(directory)!r} has no {ADAPTER_WEIGHTS} (a LoRA checkpoint written by "
                                      "save()).")
        elif (directory / ADAPTER_WEIGHTS).is_file() and not any(directory.glob("model*.safetensors")):
            raise CheckpointError(f"{str(directory)!r} holds LoRA adapter weights but this model trains the full "
                                  "model; add_adapter_to_model(name, LoraConfig(...)) first and pass adapter_name=.")

    def _load_weights(self, group: OptimizerGroup, directory: Path) -> None:
        self._check_weights(group, directory)
        if group.is_adapter:
            self.backend.adapters.load(group, directory)
        else:
            load_full_weights(self.backend.hf_model(), directory)
