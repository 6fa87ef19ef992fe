"""Reading torch.distributed.checkpoint (DCP) directories without executing a pickle from them.

DCP stores its ``.metadata`` file as a pickle and loads non-tensor values (optimizer hyper-
parameters, step counters) with ``torch.load(weights_only=False)``: a crafted checkpoint would run
code on every rank that resumes from it. Here the metadata goes through an unpickler that admits
only DCP's own metadata classes (and torch sizes, dtypes and layouts), every storage entry must
name a file inside the checkpoint directory, and byte values load with ``weights_only=True``.

- :func:`read_dcp_metadata` / :func:`verify_dcp_directory`: check a directory before any loader touches it.
- :func:`check_dcp_state`: every key and shape a load will ask for is in the checkpoint (nothing changed yet).
- :func:`dcp_load`: ``dcp.load`` through the safe reader and planner.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

from twinkle.checkpoint.errors import CheckpointError

METADATA_FILE = ".metadata"

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_PLANNER = "torch.distributed.checkpoint.planner"
#: (module, name) pairs the metadata pickle may reference; everything else is refused.
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    # megatron's dist-checkpointing keeps the save plans (plain frozen dataclasses) in ``planner_data``
    (_DCP_PLANNER, "SavePlan"),
    (_DCP_PLANNER, "WriteItem"),
    (_DCP_PLANNER, "WriteItemType"),
    (_DCP_PLANNER, "TensorWriteData"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
})


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals DCP metadata is made of (plus ``torch.<dtype>``)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not part of DCP metadata")


def read_dcp_metadata(directory: str | os.PathLike[str]) -> Any:
    """The DCP ``Metadata`` of ``directory``, read without running code; CheckpointError if it is unsafe."""
    from torch.distributed.checkpoint.metadata import Metadata

    directory = Path(directory)
    path = directory / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no {METADATA_FILE}; it is not a torch.distributed.checkpoint "
                              "directory (or its save was interrupted).")
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a hostile or corrupt file is the same verdict
        raise CheckpointError(
            f"Refusing {str(path)!r}: it is not plain DCP metadata ({type(exc).__name__}: {str(exc)[:200]}). "
            "twinkle never executes pickled code from a checkpoint; the file is corrupt or was crafted. "
            "Resume from another checkpoint."
        ) from exc
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"Refusing {str(path)!r}: it holds {type(metadata).__name__}, not DCP Metadata.")
    _check_storage(directory, metadata)
    return metadata


def _check_storage(directory: Path, metadata: Any) -> None:
    """Every storage entry names a plain file of this directory and lies within it."""
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise CheckpointError(f"{str(directory / METADATA_FILE)!r}: storage_data is {type(storage).__name__}, "
                              "not a mapping; the checkpoint is corrupt.")
    sizes: dict[str, int] = {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise CheckpointError(f"{str(directory / METADATA_FILE)!r} points outside the checkpoint ({name!r}); "
                                  "refusing it.")
        if name not in sizes:
            target = directory / name
            if not target.is_file():
                raise CheckpointError(f"{str(directory)!r} is missing {name}, which its {METADATA_FILE} lists.")
            sizes[name] = target.stat().st_size
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0 \
                or offset + length > sizes[name]:
            raise CheckpointError(f"{str(directory / name)!r} is shorter than its {METADATA_FILE} says "
                                  f"({sizes[name]} bytes, an entry at {offset}+{length}); it is truncated.")


def verify_dcp_directory(directory: str | os.PathLike[str]) -> Any:
    """Check a DCP directory that another library's reader will load (megatron's dist-checkpointing).

    The metadata must be safe (see :func:`read_dcp_metadata`) and every non-tensor value must load
    with ``weights_only=True``, so the reader's own unpickling of the same bytes runs no code.
    Returns the metadata.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    directory = Path(directory)
    metadata = read_dcp_metadata(directory)
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            continue
        info = metadata.storage_data.get(MetadataIndex(fqn))
        if info is None:
            raise CheckpointError(f"{str(directory / METADATA_FILE)!r} lists {fqn!r} but not where it is stored.")
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(f"{str(directory)!r}: {fqn!r} is stored with transforms "
                                  f"{info.transform_descriptors}, which twinkle cannot check safely.")
        with open(directory / info.relative_path, "rb") as handle:
            handle.seek(info.offset)
            _load_bytes_safely(io.BytesIO(handle.read(info.length)), f"{fqn!r} in {str(directory)!r}")
    return metadata


def _load_bytes_safely(stream: io.BytesIO, what: str) -> Any:
    import torch

    try:
        return torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"Refusing {what}: it is not a plain value ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}); twinkle never executes pickled code from a "
                              "checkpoint.") from exc


def check_dcp_state(metadata: Any, state: dict[str, Any], where: str) -> None:
    """Every key of ``state`` (nested dicts flattened as DCP does) is saved, with the same shape."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    flat, _ = flatten_state_dict(state)
    saved = metadata.state_dict_metadata
    missing = sorted(k for k in flat if k not in saved)
    mismatched = []
    for key, value in flat.items():
        item = saved.get(key)
        size = getattr(value, "size", None)
        if isinstance(item, TensorStorageMetadata) and callable(size) and tuple(item.size) != tuple(size()):
            mismatched.append(f"{key}: saved {tuple(item.size)} vs now {tuple(size())}")
    if missing or mismatched:
        problems = []
        if missing:
            problems.append(f"{len(missing)} keys are not in it (e.g. {missing[:3]})")
        if mismatched:
            problems.append(f"{len(mismatched)} shapes differ (e.g. {mismatched[:2]})")
        raise CheckpointError(f"{where} does not fit this model: {'; '.join(problems)}. Was it saved from a "
                              "different model, adapter or optimizer?")


def dcp_load(state: dict[str, Any], directory: str | os.PathLike[str]) -> None:
    """``dcp.load(state, directory)`` whose metadata and byte values are read without executing code."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, storage_reader=_safe_reader(Path(directory)), planner=_safe_planner())


def _safe_reader(directory: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            if kwargs.get("rank") is not None:
                raise CheckpointError(f"{str(directory)!r}: per-rank DCP metadata is not supported.")
            metadata = read_dcp_metadata(directory)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(directory))


def _safe_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._traverse import set_element

            loaded = _load_bytes_safely(value, repr(read_item.dest_index.fqn))
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()
