"""Checkpoints of a wrapped model on several ranks.

The directory keeps the single-process layout (HF-loadable weights or PEFT adapter, scheduler,
scaler, RNG, ``trainer_state.json``) and adds torch.distributed.checkpoint folders every rank
writes its shards into: ``dcp_model`` (the group's trainable parameters) and ``dcp_optimizer``.
The HF export is gathered (a collective) and written by rank 0. The temporary directory is named
by rank 0 and renamed by it only after every rank finished, so the atomic-rename contract holds.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from twinkle import collective
from twinkle.checkpoint import (
    RNG_FILE,
    SCALER_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    capture_rng_state,
    commit,
    make_temporary,
    restore_rng_state,
    safe_torch_load,
    torch_save,
)
from twinkle_hf.distributed import comm

DCP_MODEL = "dcp_model"
DCP_OPTIMIZER = "dcp_optimizer"
#: an async save writes weights and optimizer as one DCP checkpoint (one writer thread, one final gather)
DCP_STATE = "dcp_state"


def is_sharded(directory: Path) -> bool:
    """Whether ``directory`` holds DCP shards (a multi-process or an asynchronous save)."""
    return (directory / DCP_MODEL).is_dir() or (directory / DCP_STATE).is_dir()


@contextmanager
def shared_atomic_directory(final: Path) -> Iterator[Path]:
    """:func:`atomic_directory` for every rank: rank 0 owns the temporary name and the rename."""
    tmp = shared_temporary(final)
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        shared_commit(tmp, final, ok)


def shared_temporary(final: Path) -> Path:
    """The temporary directory for ``final``, made by rank 0 and known to every rank."""
    if comm.rank() == 0:
        return Path(comm.broadcast_object(str(make_temporary(final))))
    return Path(comm.broadcast_object(None))


def shared_commit(tmp: Path, final: Path, ok: bool = True) -> None:
    """Every rank says whether its part succeeded; rank 0 renames (or discards) ``tmp``; then all proceed."""
    try:
        comm.agree(ok, f"saving {final}")
    except BaseException:
        if comm.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not ok:  # this rank failed (the others raised in agree); its own error follows
        if comm.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if comm.rank() == 0:
        commit(tmp, final)
    comm.barrier()  # the rename is done: everyone may read the final directory


def optimizers_of(optimizer: Any) -> list[Any]:
    """The torch optimizers behind a group's optimizer (Muon+AdamW is two)."""
    inner = getattr(optimizer, "optimizers", None)
    return list(inner) if inner is not None else [optimizer]


def trainable_params(owner: Any, group: Any) -> dict[str, torch.Tensor]:
    ids = {id(p) for p in owner._group_parameters(group)}
    return {n: p for n, p in owner.model.named_parameters() if id(p) in ids}


def save_sharded(owner: Any, group: Any, directory: Path, save_optimizer: bool,
                 async_save: bool = False) -> list[Future]:
    """Every rank writes its shards of the weights (and optimizer) with DCP; rank 0 the small files.

    ``async_save``: DCP's ``async_save`` copies the tensors to host memory now and writes them in a
    background thread; the returned futures finish the writes (every file is under ``directory``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {DCP_MODEL: {n: p.detach() for n, p in trainable_params(owner, group).items()}}
    if save_optimizer and group.optimizer is not None:
        state[DCP_OPTIMIZER] = get_optimizer_state_dict(owner.model, optimizers_of(group.optimizer))
    if async_save:  # its writer thread ends with a gather: on a group of its own, never the training's
        pending = [dcp.async_save(state, checkpoint_id=str(directory / DCP_STATE),
                                  process_group=collective.background_group())]
    else:
        pending = [dcp.save(part, checkpoint_id=str(directory / name)) for name, part in state.items()]
    futures = [f for f in pending if isinstance(f, Future)]
    if not save_optimizer:
        return futures
    rank = comm.rank()
    torch_save(capture_rng_state(), directory / rng_file(rank))
    if rank == 0:
        if group.lr_scheduler is not None:
            torch_save(group.lr_scheduler.state_dict(), directory / SCHEDULER_FILE)
        if group.scaler is not None:
            torch_save(group.scaler.state_dict(), directory / SCALER_FILE)
    return futures


def rng_file(rank: int) -> str:
    """Rank 0 keeps the single-process name; the other ranks' generators sit beside it."""
    return RNG_FILE if rank == 0 else RNG_FILE.replace(".pt", f".rank{rank}.pt")


def load_sharded(owner: Any, group: Any, directory: Path, with_training_state: bool) -> None:
    """Load this rank's shards of the weights (and optimizer, scheduler, scaler, RNG)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if not is_sharded(directory):
        raise CheckpointError(f"{str(directory)!r} has no {DCP_MODEL}/ (sharded weights); it was not written by a "
                              "multi-process save. Load its HF weights with model_id= / add_adapter_to_model.")
    combined = directory / DCP_STATE

    def load(part: str, state: dict[str, Any]) -> None:
        if combined.is_dir():  # an async save: one checkpoint, loaded part by part
            dcp.load({part: state}, checkpoint_id=str(combined))
        else:
            dcp.load(state, checkpoint_id=str(directory / part))

    params = trainable_params(owner, group)
    load(DCP_MODEL, {n: p.detach() for n, p in params.items()})
    if not with_training_state:
        return
    if group.optimizer is None:
        raise RuntimeError(f"resume_from_checkpoint restores the optimizer of group {group.name!r}, which has none: "
                           "call set_optimizer first, or pass resume_only_model=True.")
    if not ((directory / DCP_OPTIMIZER).is_dir() or (combined.is_dir() and (directory / RNG_FILE).is_file())):
        raise CheckpointError(f"{str(directory)!r} has no {DCP_OPTIMIZER}/; save with save_optimizer=True.")
    optimizers = optimizers_of(group.optimizer)
    optim_state = get_optimizer_state_dict(owner.model, optimizers)
    load(DCP_OPTIMIZER, optim_state)
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
    """``save_pretrained`` of the gathered full weights, written by rank 0 (architecture name unwrapped)."""
    state = gathered_state(hf_model.state_dict())
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
    """Load HF-layout weights (adapter or full) into a wrapped model: each rank keeps its own shard."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from twinkle_hf.model.weights import ADAPTER_WEIGHTS, _read_safetensors, read_full_weights

    if group.is_adapter:
        path = directory / ADAPTER_WEIGHTS
        if not path.is_file():
            raise CheckpointError(f"{str(directory)!r} has no {ADAPTER_WEIGHTS} (a LoRA checkpoint written by save()).")
        state = _read_safetensors(path)
        params = {n.replace(f".{group.name}.", "."): p for n, p in trainable_params(owner, group).items()}
    else:
        state = read_full_weights(directory)
        params = dict(owner._hf_model().named_parameters())
    missing = sorted(set(params) - set(state))
    if group.is_adapter and missing:
        raise CheckpointError(f"The weights in {directory} miss {len(missing)} keys of this model (e.g. "
                              f"{missing[:3]}); was it saved from a different adapter configuration?")
    with torch.no_grad():
        for name, param in params.items():
            if name not in state:
                continue  # tied weights are stored once
            full = state[name].to(dtype=param.dtype)
            if tuple(full.shape) != tuple(param.shape):
                raise CheckpointError(f"{name}: file {tuple(full.shape)} vs model {tuple(param.shape)} in "
                                      f"{directory}.")
            if isinstance(param, DTensor):
                shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(full.to(param.device))
