"""Capture and restore every random generator a training step may draw from."""

from __future__ import annotations

import random
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (when present) CUDA generator states, in torch-loadable form.

    NumPy's key array is stored as a tensor so ``torch.load(weights_only=True)`` can read it back.
    """
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": _python_state_to_lists(random.getstate()),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def check_rng_state(state: Any, where: str = "The saved RNG state") -> None:
    """Raise CheckpointError unless every generator state in ``state`` can be applied.

    Each state is tried on a scratch generator, so a malformed file is found before anything
    (weights, optimizer, the process's own generators) has been changed.
    """
    _prepare(state, where)


def restore_rng_state(state: dict[str, Any], where: str = "The saved RNG state") -> None:
    """Put back what :func:`capture_rng_state` returned (checked first: nothing changes if it is malformed)."""
    import numpy as np
    import torch

    python_state, numpy_state, torch_state, cuda_states = _prepare(state, where)
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda_states is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)


def _prepare(state: Any, where: str) -> tuple[Any, Any, Any, Any]:
    import numpy as np
    import torch

    try:
        version, internal, gauss = state["python"]
        python_state = (version, tuple(internal), gauss)
        random.Random().setstate(python_state)
        np_state = state["numpy"]
        numpy_state = (np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                       np_state["has_gauss"], np_state["cached_gaussian"])
        np.random.RandomState().set_state(numpy_state)
        torch_state = state["torch"]
        if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8:
            raise TypeError("torch generator state must be a uint8 tensor")
        torch.Generator().set_state(torch_state)
        cuda_states = state.get("cuda")
        if cuda_states is not None and not (isinstance(cuda_states, (list, tuple)) and all(
                isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda_states)):
            raise TypeError("cuda generator states must be a list of uint8 tensors")
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as exc:
        raise CheckpointError(f"{where} is malformed ({type(exc).__name__}: {str(exc)[:200]}); the checkpoint is "
                              "corrupt. Resume from another checkpoint, or pass resume_only_model=True.") from exc
    return python_state, numpy_state, torch_state, cuda_states


def _python_state_to_lists(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]
