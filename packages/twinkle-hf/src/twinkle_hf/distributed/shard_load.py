"""Filling a sharded model from checkpoint files: each rank reads only its own slices.

The order is torchtitan's: the model was built on the meta device (``twinkle_hf.model.meta``),
adapters were added, FSDP2 sharded it (still no storage); :func:`materialize` gives every rank
storage for its shards only (``to_empty``) and puts back what already held values (adapter
weights initialised by peft, buffers such as rotary ``inv_freq``); :func:`read_shards` then
copies each parameter's slice straight from the safetensors files. A file is opened per tensor,
so its memory map is released after every read and a rank's peak stays at its shards plus one
slice. No collective is involved: every rank reads its own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from twinkle.checkpoint import CheckpointError


def real_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Values that exist before sharding and must survive ``to_empty``: non-meta parameters and every buffer."""
    kept = {name: p.detach().clone() for name, p in model.named_parameters() if not p.is_meta}
    kept.update({f"buffer:{name}": b.detach().clone() for name, b in model.named_buffers() if not b.is_meta})
    return kept


def materialize(model: torch.nn.Module, device: torch.device, kept: Mapping[str, torch.Tensor]) -> None:
    """Storage for this rank's shards on ``device``, then the kept values copied back into them."""
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in kept:
                copy_slice(param, kept[name].__getitem__)
        for name, buffer in model.named_buffers():
            value = kept.get(f"buffer:{name}")
            if value is not None:
                buffer.copy_(value)


def local_part(target: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(this rank's local tensor, the slices of the full tensor it holds); the whole tensor when not a DTensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(target, DTensor):
        return target.detach(), tuple(slice(0, n) for n in target.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
    return target.to_local().detach(), tuple(slice(o, o + n) for o, n in zip(offset, shape))


def copy_slice(target: torch.Tensor, read: Callable[[tuple[slice, ...]], torch.Tensor]) -> None:
    """Copy this rank's part of a full tensor into ``target``; ``read(slices)`` returns that part (lazily)."""
    local, index = local_part(target)
    if local.numel():
        local.copy_(read(index))


def read_shards(targets: Mapping[str, torch.Tensor], files: Mapping[str, Path], where: str) -> None:
    """Fill every ``targets[key]`` (a DTensor or a plain tensor) with its part of checkpoint tensor ``key``.

    ``files`` maps each checkpoint key to the safetensors file holding it. Shapes are checked
    before anything is copied, so a wrong checkpoint leaves the model as it was.
    """
    from safetensors import safe_open

    missing = sorted(k for k in targets if k not in files)
    if missing:
        raise CheckpointError(f"The weights in {where} miss {len(missing)} keys of this model (e.g. {missing[:3]}).")
    by_file: dict[Path, list[str]] = {}
    for key in targets:
        by_file.setdefault(files[key], []).append(key)
    mismatched = []
    for file, keys in by_file.items():
        with _open(file) as handle:
            mismatched += [f"{k}: file {tuple(handle.get_slice(k).get_shape())} vs model {tuple(targets[k].shape)}"
                           for k in keys if tuple(handle.get_slice(k).get_shape()) != tuple(targets[k].shape)]
    if mismatched:
        raise CheckpointError(f"The weights in {where} do not fit this model: {len(mismatched)} shape mismatches "
                              f"(e.g. {mismatched[:2]}).")
    with torch.no_grad():
        for key, target in targets.items():
            with safe_open(str(files[key]), framework="pt") as handle:  # released after each tensor
                rows = handle.get_slice(key)
                copy_slice(target, lambda index: rows[index] if index else handle.get_tensor(key))  # noqa: B023


def _open(file: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt")
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{str(file)!r} is not a readable safetensors file ({type(exc).__name__}: "
                              f"{exc}).") from exc


def fill_from_checkpoint(model: torch.nn.Module, directory: str | Path, skip: set[str] = frozenset()) -> None:
    """Read every parameter (and persistent buffer) of ``model`` stored in ``directory`` into its shards.

    Names are mapped to checkpoint keys the way ``save_pretrained`` writes them (peft's wrappers
    removed, tied weights read once); names in ``skip`` keep their values (adapters).
    """
    from twinkle_hf.model.meta import aliases, file_key
    from twinkle_hf.model.weights import weight_files

    files = weight_files(directory)
    if files is None:
        raise CheckpointError(f"{str(directory)!r} has no safetensors weights to read shards from.")
    names = aliases(model)
    targets: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if name in skip:
            continue
        key = next((file_key(n) for n in names[id(param)] if file_key(n) in files), file_key(name))
        targets[key] = param
    persistent = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in persistent and file_key(name) in files:
            targets[file_key(name)] = buffer
    read_shards(targets, files, str(directory))
