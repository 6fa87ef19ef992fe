"""Reading HF safetensors checkpoints tensor by tensor, and writing ``save_pretrained``-layout directories.

Reading is lazy (``safe_open``): a rank reads only the tensors it needs, one at a time. Writing
may be split over several ranks (pipeline stages, expert-parallel ranks): each writes its own
``model-<part>.safetensors`` and one rank writes ``model.safetensors.index.json`` naming them all.
Only safetensors are read or written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from twinkle.checkpoint import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class SafetensorsReader:
    """Tensor-by-tensor access to a directory holding ``model.safetensors`` or a sharded index."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._where = self._locate()

    def _locate(self) -> dict[str, Path]:
        index = self.directory / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{str(index)!r} is not a valid safetensors index ({exc}).") from exc
            return {name: self.directory / file for name, file in weight_map.items()}
        files = sorted(self.directory.glob("*.safetensors"))
        files = [f for f in files if f.name != "adapter_model.safetensors"]
        if not files:
            bins = sorted(p.name for p in self.directory.glob("*.bin"))
            hint = f" It holds {bins}: convert them to safetensors first." if bins else ""
            raise CheckpointError(f"{str(self.directory)!r} has no model safetensors ({SINGLE} or {INDEX}).{hint}")
        where: dict[str, Path] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                where.update({name: file for name in handle.keys()})
        return where

    def keys(self) -> list[str]:
        return sorted(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise CheckpointError(f"{str(self.directory)!r} has no tensor {name!r} (it has e.g. {self.keys()[:4]}).")
        try:
            with safe_open(str(self._where[name]), framework="pt") as handle:
                return handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own types for corrupt files
            raise CheckpointError(f"Could not read {name!r} from {str(self._where[name])!r}: {exc}") from exc

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        return {name: self.get(name) for name in names}


class TensorLookup(Mapping[str, torch.Tensor]):
    """A read-only mapping over a reader, so converters can index HF tensors by name lazily."""

    def __init__(self, reader: SafetensorsReader) -> None:
        self.reader = reader

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.reader.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.reader.keys())

    def __len__(self) -> int:
        return len(self.reader.keys())


def write_part(directory: Path, tensors: Mapping[str, torch.Tensor], part: str | None) -> str:
    """Write one safetensors file (``model.safetensors`` when ``part`` is None); returns its file name."""
    name = SINGLE if part is None else f"model-{part}.safetensors"
    state = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    save_file(state, str(directory / name), metadata={"format": "pt"})
    return name


def write_index(directory: Path, weight_map: Mapping[str, str], total_size: int) -> None:
    payload = {"metadata": {"total_size": int(total_size)}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
