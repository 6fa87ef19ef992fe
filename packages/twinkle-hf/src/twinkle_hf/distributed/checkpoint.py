"""The sharded half of a TransformersModel's checkpoint: torch.distributed.checkpoint folders every rank writes.

A distributed model's checkpoint (and an asynchronous one on any number of processes) keeps the HF
export of the single-process layout -- gathered, written by rank 0 -- and adds DCP folders holding each
rank's shards: ``dcp_model`` (the group's trainable parameters) and ``dcp_optimizer``; an asynchronous
save writes both as one DCP checkpoint, ``dcp_state`` (one writer thread, one final gather). Reading
checks every key and shape without running pickled code (``twinkle.checkpoint.dcp_safe``) before
anything is loaded. The directory, the side files and the agreement of the ranks are the checkpoint
manager's (``twinkle.checkpoint.manager``).
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from twinkle import collective
from twinkle.checkpoint import CheckpointError

DCP_MODEL = "dcp_model"
DCP_OPTIMIZER = "dcp_optimizer"
#: an async save writes weights and optimizer as one DCP checkpoint (one writer thread, one final gather)
DCP_STATE = "dcp_state"


def is_sharded(directory: Path) -> bool:
    """Whether ``directory`` holds DCP shards (a multi-process or an asynchronous save)."""
    return (directory / DCP_MODEL).is_dir() or (directory / DCP_STATE).is_dir()


def optimizers_of(optimizer: Any) -> list[Any]:
    """The torch optimizers behind a group's optimizer (Muon+AdamW is two)."""
    inner = getattr(optimizer, "optimizers", None)
    return list(inner) if inner is not None else [optimizer]


def trainable_params(backend: Any, group: Any) -> dict[str, torch.Tensor]:
    ids = {id(p) for p in backend.parameters(group)}
    return {n: p for n, p in backend.module.named_parameters() if id(p) in ids}


def save_sharded(owner: Any, group: Any, directory: Path, save_optimizer: bool,
                 async_save: bool = False) -> list[Future]:
    """Every rank writes its shards of the weights (and optimizer) with DCP.

    ``async_save``: DCP's ``async_save`` copies the tensors to host memory now and writes them in a
    background thread; the returned futures finish the writes (every file is under ``directory``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {DCP_MODEL: {n: p.detach() for n, p in trainable_params(owner, group).items()}}
    if save_optimizer and group.optimizer is not None:
        state[DCP_OPTIMIZER] = get_optimizer_state_dict(owner.module, optimizers_of(group.optimizer))
    if async_save:  # its writer thread ends with a gather: on a group of its own, never the training's
        pending = [dcp.async_save(state, checkpoint_id=str(directory / DCP_STATE),
                                  process_group=collective.background_group())]
    else:
        pending = [dcp.save(part, checkpoint_id=str(directory / name)) for name, part in state.items()]
    return [f for f in pending if isinstance(f, Future)]


def read_sharded(owner: Any, group: Any, directory: Path, with_optimizer: bool) -> dict[str, Any]:
    """Check this rank's shards of the weights (and optimizer state) in ``directory``; nothing changes.

    Returns the state dicts :func:`apply_sharded` loads into: the DCP metadata is read without unpickling
    code, and every key and shape a load will ask for must be in it.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    staged = {DCP_MODEL: {n: p.detach() for n, p in trainable_params(owner, group).items()}}
    _check_dcp(directory, DCP_MODEL, staged[DCP_MODEL], "sharded weights")
    if with_optimizer:
        optimizers = optimizers_of(group.optimizer)
        fresh = [opt for opt in optimizers if not opt.state]
        try:
            staged[DCP_OPTIMIZER] = get_optimizer_state_dict(owner.module, optimizers)
        finally:  # reading the layout initialised a fresh optimizer's state: undone (apply does it again)
            for opt in fresh:
                opt.state.clear()
        _check_dcp(directory, DCP_OPTIMIZER, staged[DCP_OPTIMIZER], "optimizer state")
    return staged


def apply_sharded(owner: Any, group: Any, directory: Path, staged: dict[str, Any]) -> None:
    """Load the shards :func:`read_sharded` checked: the weights, then the optimizer state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    from twinkle.checkpoint.dcp_safe import dcp_load

    dcp_load(*_dcp_part(directory, DCP_MODEL, staged[DCP_MODEL]))
    if DCP_OPTIMIZER in staged:
        dcp_load(*_dcp_part(directory, DCP_OPTIMIZER, staged[DCP_OPTIMIZER]))
        set_optimizer_state_dict(owner.module, optimizers_of(group.optimizer), staged[DCP_OPTIMIZER])


def _dcp_part(directory: Path, part: str, state: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """``(state to load, DCP directory)`` of one part: its own folder, or its key in an async save's ``dcp_state``."""
    combined = directory / DCP_STATE
    if combined.is_dir():
        return {part: state}, combined
    return state, directory / part


def _check_dcp(directory: Path, sub: str, state: dict[str, Any], what: str) -> None:
    from twinkle.checkpoint.dcp_safe import check_dcp_state, verify_dcp_directory

    wrapped, location = _dcp_part(directory, sub, state)
    hint = ("save with save_optimizer=True" if sub == DCP_OPTIMIZER else "it was not written by a multi-process "
            "or asynchronous save. Load its HF weights with model_id= / add_adapter_to_model")
    if not location.is_dir():
        raise CheckpointError(f"{str(directory)!r} has no {sub}/ ({what}); {hint}.")
    metadata = verify_dcp_directory(location)
    if location.name == DCP_STATE and not any(k.startswith(f"{sub}.") for k in metadata.state_dict_metadata):
        raise CheckpointError(f"{str(location)!r} holds no {what}; {hint}.")
    check_dcp_state(metadata, wrapped, f"{str(location)!r}")


def gathered_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full CPU tensors of a (possibly sharded) state dict; every rank must call it."""
    return {k: collective.full_tensor(v.detach()).contiguous().cpu() for k, v in state.items()}


def save_full_export(hf_model: torch.nn.Module, directory: Path) -> None:
    """``save_pretrained`` of the full weights, written by rank 0 (architecture name unwrapped).

    The weights are gathered tensor by tensor and kept in host memory on rank 0 only
    (``full_state_dict=True, cpu_offload=True``): the other ranks never hold more than their shards
    and the one tensor being gathered.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(hf_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if collective.rank() != 0:
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
        fill_from_checkpoint(owner.hf_model(), directory)
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
