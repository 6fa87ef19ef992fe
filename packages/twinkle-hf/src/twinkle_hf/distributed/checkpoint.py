"""Checkpoints of a wrapped model on several ranks.

The directory keeps the single-process layout (HF-loadable weights or PEFT adapter, scheduler,
scaler, RNG, ``trainer_state.json``) and adds torch.distributed.checkpoint folders every rank
writes its shards into: ``dcp_model`` (the group's trainable parameters) and ``dcp_optimizer``.
The HF export is gathered (a collective) and written by rank 0. The temporary directory is named
by rank 0 and renamed by it only after every rank finished, so the atomic-rename contract holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from twinkle.checkpoint import (
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    atomic_directory,
    capture_rng_state,
    restore_rng_state,
    safe_torch_load,
    torch_save,
)
from twinkle_hf.distributed import comm

DCP_MODEL = "dcp_model"
DCP_OPTIMIZER = "dcp_optimizer"


@contextmanager
def shared_atomic_directory(final: Path) -> Iterator[Path]:
    """:func:`atomic_directory` for every rank: rank 0 owns the temporary name and the rename."""
    if comm.rank() == 0:
        with atomic_directory(final) as tmp:
            comm.broadcast_object(str(tmp))
            ok = False
            try:
                yield tmp
                ok = True
            finally:
                comm.agree(ok, f"saving {final}")
            if not ok:
                return
        comm.barrier()  # the rename is done: everyone may read the final directory
        return
    tmp = Path(comm.broadcast_object(None))
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        comm.agree(ok, f"saving {final}")
    comm.barrier()


def optimizers_of(optimizer: Any) -> list[Any]:
    """The torch optimizers behind a group's optimizer (Muon+AdamW is two)."""
    inner = getattr(optimizer, "optimizers", None)
    return list(inner) if inner is not None else [optimizer]


def trainable_params(owner: Any, group: Any) -> dict[str, torch.Tensor]:
    ids = {id(p) for p in owner._group_parameters(group)}
    return {n: p for n, p in owner.model.named_parameters() if id(p) in ids}


def save_sharded(owner: Any, group: Any, directory: Path, save_optimizer: bool) -> None:
    """Every rank writes its shards of the weights (and optimizer) with DCP; rank 0 the small files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({n: p.detach() for n, p in trainable_params(owner, group).items()},
             checkpoint_id=str(directory / DCP_MODEL))
    if not save_optimizer:
        return
    if group.optimizer is not None:
        state = get_optimizer_state_dict(owner.model, optimizers_of(group.optimizer))
        dcp.save(state, checkpoint_id=str(directory / DCP_OPTIMIZER))
    rank = comm.rank()
    torch_save(capture_rng_state(), directory / rng_file(rank))
    if rank == 0:
        if group.lr_scheduler is not None:
            torch_save(group.lr_scheduler.state_dict(), directory / SCHEDULER_FILE)
        if group.scaler is not None:
            torch_save(group.scaler.state_dict(), directory / SCALER_FILE)


def rng_file(rank: int) -> str:
    """Rank 0 keeps the single-process name; the other ranks' generators sit beside it."""
    return RNG_FILE if rank == 0 else RNG_FILE.replace(".pt", f".rank{rank}.pt")


def load_sharded(owner: Any, group: Any, directory: Path, with_training_state: bool) -> None:
    """Load this rank's shards of the weights (and optimizer, scheduler, scaler, RNG)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if not (directory / DCP_MODEL).is_dir():
        raise CheckpointError(f"{str(directory)!r} has no {DCP_MODEL}/ (sharded weights); it was not written by a "
                              "multi-process save. Load its HF weights with model_id= / add_adapter_to_model.")
    params = trainable_params(owner, group)
    state = {n: p.detach() for n, p in params.items()}
    dcp.load(state, checkpoint_id=str(directory / DCP_MODEL))
    if not with_training_state:
        return
    if group.optimizer is None:
        raise RuntimeError(f"resume_from_checkpoint restores the optimizer of group {group.name!r}, which has none: "
                           "call set_optimizer first, or pass resume_only_model=True.")
    if not (directory / DCP_OPTIMIZER).is_dir():
        raise CheckpointError(f"{str(directory)!r} has no {DCP_OPTIMIZER}/; save with save_optimizer=True.")
    optimizers = optimizers_of(group.optimizer)
    optim_state = get_optimizer_state_dict(owner.model, optimizers)
    dcp.load(optim_state, checkpoint_id=str(directory / DCP_OPTIMIZER))
    set_optimizer_state_dict(owner.model, optimizers, optim_state)
    if group.lr_scheduler is not None:
        group.lr_scheduler.load_state_dict(safe_torch_load(directory / SCHEDULER_FILE))
    if group.scaler is not None:
        group.scaler.load_state_dict(safe_torch_load(directory / SCALER_FILE))
    rng = directory / rng_file(comm.rank())
    restore_rng_state(safe_torch_load(rng if rng.is_file() else directory / RNG_FILE))


def gathered_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full CPU tensors of a (possibly sharded) state dict; every rank must call it."""
    return {k: comm.full_tensor(v.detach()).contiguous().cpu() for k, v in state.items()}


def save_full_export(hf_model: torch.nn.Module, directory: Path) -> None:
    """``save_pretrained`` of the full weights, written by rank 0 (architecture name unwrapped).

    The weights are gathered tensor by tensor and kept in host memory on rank 0 only
    (``full_state_dict=True, cpu_offload=True``): the other ranks never hold more than their shards
    and the one tensor being gathered.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(hf_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if comm.rank() != 0:
        return
    hf_model.save_pretrained(str(directory), state_dict=state)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = [_unwrapped_class(hf_model).__name__]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _unwrapped_class(module: torch.nn.Module) -> type:
    """FSDP2 swaps the class to ``FSDP<Name>``; the HF class is the first base that is not FSDP's."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(module).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls
    return type(module)


def load_export(owner: Any, group: Any, directory: Path) -> None:
    """Load HF-layout weights (adapter or full) into a wrapped model: each rank keeps its own shard.

    A full model is read slice by slice from the files (every rank reads only its shards); an
    adapter is small and read whole.
    """
    from twinkle_hf.distributed.shard_load import copy_slice, fill_from_checkpoint
    from twinkle_hf.model.weights import ADAPTER_WEIGHTS, _read_safetensors

    if not group.is_adapter:
        fill_from_checkpoint(owner._hf_model(), directory)
        return
    path = directory / ADAPTER_WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no {ADAPTER_WEIGHTS} (a LoRA checkpoint written by save()).")
    state = _read_safetensors(path)
    params = {n.replace(f".{group.name}.", "."): p for n, p in trainable_params(owner, group).items()}
    missing = sorted(set(params) - set(state))
    if missing:
        raise CheckpointError(f"The weights in {directory} miss {len(missing)} keys of this model (e.g. "
                              f"{missing[:3]}); was it saved from a different adapter configuration?")
    shapes = [f"{n}: file {tuple(state[n].shape)} vs model {tuple(p.shape)}" for n, p in params.items()
              if tuple(state[n].shape) != tuple(p.shape)]
    if shapes:
        raise CheckpointError(f"The weights in {directory} do not fit this model: {shapes[:2]}.")
    with torch.no_grad():
        for name, param in params.items():
            copy_slice(param, state[name].__getitem__)
