"""torch.save / torch.load for checkpoint side files; loading never unpickles arbitrary objects."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


def torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Save ``obj`` (tensors, numbers, strings, lists, dicts) and flush it to disk."""
    import torch

    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def safe_torch_load(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, map_location='cpu', weights_only=True)`` with errors that name the file."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist.")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"Could not load {str(path)!r} safely ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}). "
            "The file is corrupt, truncated, or holds objects other than tensors and plain containers."
        ) from exc
