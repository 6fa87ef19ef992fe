"""Writing a MegatronModel's weights as HF files: a ``save_pretrained`` directory or a PEFT adapter directory.

Full model: the tensors of a pipeline stage are gathered over TP on every TP rank, and written by
the ranks with ``tp == cp == 0`` and a data-parallel rank below ``ep_size`` (the first ``ep_size``
data-parallel ranks hold different experts, rank 0 also the dense tensors). One writer gives
``model.safetensors``; several give ``model-pp000-ep000.safetensors``... plus the index. Adapters are
small: they are gathered on rank 0 and written there.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from twinkle import collective
from twinkle.hub import portable_id
from twinkle_megatron.bridge.hf_io import tensor_bytes, write_index, write_part
from twinkle_megatron.bridge.transfer import export_from
from twinkle_megatron.lora.peft_io import adapter_config, write_adapter


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def _writer(backend: Any) -> tuple[bool, bool]:
    """(writes expert tensors, writes dense tensors) for this rank."""
    r = backend.ranks
    base = r.tp == 0 and r.cp == 0
    return base and r.dp < backend.sizes.ep, base and r.dp == 0


def hf_config_for_save(backend: Any, dtype: torch.dtype) -> Any:
    config = copy.deepcopy(backend.hf_config)
    config.architectures = [backend.args.family.architecture]
    config.dtype = dtype
    return config


def write_full(backend: Any, directory: Path) -> None:
    """Every rank calls this (TP gathers are collective); writers write, rank 0 adds config and index."""
    tensors = export_from(backend.gpt, backend.args, backend.layout)
    experts, dense = _writer(backend)
    mine = {k: v for k, v in tensors.items() if (experts and _is_expert(k)) or (dense and not _is_expert(k))}
    single = backend.sizes.pp == 1 and backend.sizes.ep == 1
    part = None if single else f"pp{backend.ranks.pp:03d}-ep{backend.ranks.ep:03d}"
    record = None
    if mine:
        file = write_part(directory, mine, part)
        record = (file, sorted(mine), tensor_bytes(mine))
    records = collective.gather_object(record)
    if collective.rank() != 0:
        return
    dtype = next(iter(tensors.values())).dtype if tensors else torch.float32
    hf_config_for_save(backend, dtype).save_pretrained(str(directory))
    if not single:
        written = [r for r in records if r is not None]
        weight_map = {key: file for file, keys, _ in written for key in keys}
        write_index(directory, weight_map, sum(size for _, _, size in written))


def write_adapter_dir(backend: Any, tensors: dict[str, torch.Tensor], config: Any, suffixes: list[str],
                      directory: Path) -> None:
    """PEFT ``adapter_model.safetensors`` + ``adapter_config.json`` of an adapter's ``tensors`` (rank 0 writes)."""
    _, dense = _writer(backend)
    pieces = collective.gather_object({k: v.cpu() for k, v in tensors.items()} if dense else {})
    if collective.rank() != 0:
        return
    merged: dict[str, torch.Tensor] = {}
    for piece in pieces:
        merged.update(piece)
    write_adapter(directory, merged, adapter_config(config, suffixes, portable_id(backend.model_id)))
