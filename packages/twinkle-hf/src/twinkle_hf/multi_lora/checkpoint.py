"""A tenant's checkpoint files, the same whatever slot, plan or timing: written so they resume into any slot.

A tenant is paged out of one slot and back into whichever slot is free (``twinkle_server/paging.py``),
so its checkpoint must not name the slot. The single-process layout does not: the PEFT adapter at the
tenant's rank r (``adapter_model.safetensors`` + ``adapter_config.json``, keys without the slot's
adapter name) and ``optimizer.pt``, a torch optimizer state dict keyed by parameter order. DCP shards
are keyed by the module's parameter names (``...lora_A.lora_0.weight``) and DCP optimizer state by
fully-qualified names: a tenant written that way resumes into its old slot only. So a tenant is always
written in the single-process layout, on one process or many, at once or in the background:

* every rank takes host copies of the whole tensors now (gathered from the shards under FSDP2: a
  collective, every rank calls it; a tenant's adapter and moments are small);
* rank 0 writes them -- at once, or with ``async_save=True`` on a thread of its own while training
  goes on (the copies are the tenant's state at the call: a later step, a release or another tenant in
  the slot change nothing in them). The checkpoint manager renames the directory once written;
* resuming reads the same files on every rank and puts each optimizer state tensor where its parameter
  lives (this rank's shard of it under FSDP2).

Checkpoints an older twinkle wrote under torchrun hold DCP shards and no ``optimizer.pt``; they still resume
into the slot they were saved from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from twinkle import collective
from twinkle.checkpoint import OPTIMIZER_FILE, CheckpointError, require_files, safe_torch_load, torch_save
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.distributed import checkpoint as dist_ckpt
from twinkle_hf.model.checkpoint import HFCheckpointState
from twinkle_hf.model.optim import check_optimizer_state


class TenantCheckpointState(HFCheckpointState):
    """A multi-LoRA model's checkpoint state: the tenant's PEFT adapter + ``optimizer.pt``, slot-agnostic."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend, supports_async=True)

    def trainer_fields(self, async_save: bool) -> dict[str, Any]:
        plan = self.backend.dist_plan
        ranks = {"world_size": plan.world_size, "strategy": plan.kind} if plan.distributed else {}
        return {"mixed_precision": self.backend.mixed_precision, **ranks}

    # -------------------------------------------------------------------- saving
    def write(self, group: OptimizerGroup, directory: Path, save_optimizer: bool,
              async_save: bool) -> list[Future]:
        backend = self.backend
        self._require_wrapped("save")
        weights = backend.adapters.state_dict(group)  # gathered CPU copies (tenant_io.tenant_state_dict)
        optimizer = host_copy(group.optimizer.state_dict()) if save_optimizer and group.optimizer is not None \
            else None
        if collective.rank() != 0:
            return []
        write_adapter = backend.adapters.files_writer(group, weights)

        def write_files() -> None:
            write_adapter(directory)
            if optimizer is not None:
                torch_save(optimizer, directory / OPTIMIZER_FILE)

        if not async_save:
            write_files()
            return []
        return [in_background(write_files, f"twinkle-save-{group.name}")]

    # ------------------------------------------------------------------- reading
    def read(self, group: OptimizerGroup, directory: Path, with_optimizer: bool) -> Any:
        if with_optimizer and _written_as_shards(directory):
            self._require_wrapped("resume_from_checkpoint")
            return "shards", dist_ckpt.read_sharded(self.backend, group, directory, with_optimizer)
        self._check_weights(group, directory)
        if not with_optimizer:
            return "files", None
        require_files(directory, [OPTIMIZER_FILE], "optimizer state")
        path = directory / OPTIMIZER_FILE
        optimizer = safe_torch_load(path)
        try:
            check_optimizer_state(group.optimizer, optimizer)
            _check_shapes(group.optimizer, optimizer)
        except ValueError as exc:
            raise CheckpointError(f"{str(path)!r} does not fit group {group.name!r}'s optimizer: {exc}.") from exc
        return "files", optimizer

    def apply(self, group: OptimizerGroup, directory: Path, staged: Any) -> None:
        kind, state = staged
        if kind == "shards":
            dist_ckpt.apply_sharded(self.backend, group, directory, state)
            return
        self.backend.adapters.load(group, directory)
        if state is not None:
            group.optimizer.load_state_dict(placed(group.optimizer, state))


def _written_as_shards(directory: Path) -> bool:
    """A tenant checkpoint of an older twinkle under torchrun: DCP shards keyed by its slot, no optimizer.pt."""
    return dist_ckpt.is_sharded(directory) and not (directory / OPTIMIZER_FILE).is_file()


def in_background(write: Callable[[], None], name: str) -> Future:
    """Run ``write()`` on a thread of its own; the future holds its outcome (the thread ends with it)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    future = pool.submit(write)
    pool.shutdown(wait=False)  # the thread finishes this one write, then exits
    return future


def host_copy(state: Any) -> Any:
    """``state`` (an optimizer state dict, nested) with every tensor a CPU copy of the whole tensor.

    Under FSDP2 the moments are DTensor shards: gathered in the state dict's order, the same on every rank.
    """
    if isinstance(state, torch.Tensor):
        return collective.full_tensor(state.detach()).to("cpu", copy=True)
    if isinstance(state, Mapping):
        return {k: host_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(host_copy(v) for v in state)
    return state


def _params_by_index(optimizer: Any, state: Mapping[str, Any]) -> dict[Any, torch.Tensor]:
    """The saved state's parameter index -> this optimizer's parameter (torch pairs them by order)."""
    saved = [i for g in state["param_groups"] for i in g["params"]]
    return dict(zip(saved, [p for g in optimizer.param_groups for p in g["params"]], strict=True))


def _torch_optimizers(optimizer: Any, state: Any) -> list[tuple[Any, Any]]:
    """(torch optimizer, its state dict) pairs: Muon+AdamW is two, saved as ``{'muon': ..., 'adamw': ...}``."""
    if getattr(optimizer, "optimizers", None) is not None and "state" not in state:
        return [(getattr(optimizer, k), v) for k, v in state.items()]
    return [(optimizer, state)]


def _check_shapes(optimizer: Any, state: Any) -> None:
    """Every saved moment has its parameter's (whole) shape: same slots' max_r and layers."""
    for torch_optimizer, part in _torch_optimizers(optimizer, state):
        params = _params_by_index(torch_optimizer, part)
        for index, entry in part["state"].items():
            want = tuple(params[index].shape)
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != want:
                    raise ValueError(f"state {key!r} of parameter {index} has shape {tuple(value.shape)}, the "
                                     f"parameter {want} (saved with another max_r or model?)")


def placed(optimizer: Any, state: Any) -> Any:
    """``state`` (whole tensors) with each parameter's moments laid out as the parameter is: this rank's shard
    of them where the parameter is an FSDP2 DTensor (cut locally, no communication); as saved otherwise."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    pairs = _torch_optimizers(optimizer, state)
    out = []
    for torch_optimizer, part in pairs:
        params = _params_by_index(torch_optimizer, part)
        moments = {}
        for index, entry in part["state"].items():
            param = params[index]
            moments[index] = {k: distribute_tensor(v.to(param.device), param.device_mesh, param.placements,
                                                   src_data_rank=None)
                              if isinstance(param, DTensor) and isinstance(v, torch.Tensor)
                              and tuple(v.shape) == tuple(param.shape) else v
                              for k, v in entry.items()}
        out.append({**part, "state": moments})
    if len(pairs) == 1 and pairs[0][1] is state:
        return out[0]
    return dict(zip(state, out, strict=True))
