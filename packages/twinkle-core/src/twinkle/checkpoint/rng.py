"""Capture and restore every random generator a training step may draw from.

Each rank saves its own generators: Python, NumPy, torch's CPU generator and the generator of the
accelerator it runs on (its *current* CUDA/NPU device, not every device the process can see), with
the device layout it was saved under. Restoring puts that generator on the current device, so a
run resumes on a machine with a different number of visible devices; a layout that differs is
reported, since the random streams of other devices are not carried over.
"""

from __future__ import annotations

import random
from typing import Any

from twinkle.checkpoint.errors import CheckpointError
from twinkle.log import get_logger

logger = get_logger()
#: Accelerator families whose current-device generator is saved (``torch.<name>``).
ACCELERATORS = ("cuda", "npu")


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (when in use) the current accelerator device's generator, torch-loadable.

    NumPy's key array is stored as a tensor so ``torch.load(weights_only=True)`` can read it back.
    ``state['cuda']`` is this rank's current CUDA device's generator and ``state['cuda_layout']``
    ``{'device': index, 'device_count': visible devices}`` (likewise for ``npu``).
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
    for name, module in _accelerators():
        state[name] = module.get_rng_state()
        state[f"{name}_layout"] = {"device": int(module.current_device()), "device_count": int(module.device_count())}
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

    python_state, numpy_state, torch_state, devices = _prepare(state, where)
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    for name, module in _accelerators(initialised=False):
        if name in devices:
            _restore_device_generator(name, module, *devices[name])


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
        devices = {name: (state[name], _check_layout(state.get(f"{name}_layout"), name))
                   for name in ACCELERATORS if state.get(name) is not None}
        for name, (saved, _) in devices.items():
            _check_device_state(saved, name)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as exc:
        raise CheckpointError(f"{where} is malformed ({type(exc).__name__}: {str(exc)[:200]}); the checkpoint is "
                              "corrupt. Resume from another checkpoint, or pass resume_only_model=True.") from exc
    return python_state, numpy_state, torch_state, devices


def _is_generator_state(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8


def _check_device_state(saved: Any, name: str) -> None:
    """One uint8 generator state (this rank's device), or a list of them (checkpoints before the per-rank format)."""
    if _is_generator_state(saved):
        return
    if isinstance(saved, (list, tuple)) and saved and all(_is_generator_state(t) for t in saved):
        return
    raise TypeError(f"{name} generator state must be a uint8 tensor or a list of them")


def _check_layout(layout: Any, name: str) -> Any:
    if layout is not None and not (isinstance(layout, dict) and set(layout) <= {"device", "device_count"}):
        raise TypeError(f"{name}_layout must be {{'device': index, 'device_count': count}}")
    return layout


def _accelerators(initialised: bool = True) -> list[tuple[str, Any]]:
    """``(name, torch.<name>)`` of the accelerator families available here (and in use, if ``initialised``)."""
    import torch

    found = []
    for name in ACCELERATORS:
        module = getattr(torch, name, None)
        if module is None or not module.is_available():
            continue
        if initialised and not module.is_initialized():
            continue
        found.append((name, module))
    return found


def _restore_device_generator(name: str, module: Any, saved: Any, layout: Any) -> None:
    """This rank's saved generator onto its current device; a different device layout is reported."""
    device, count = int(module.current_device()), int(module.device_count())
    if isinstance(saved, (list, tuple)):  # checkpoints before the per-rank format: one state per visible device
        if len(saved) == count:
            module.set_rng_state_all(saved)
            return
        layout = {"device": None, "device_count": len(saved)}
        saved = saved[device] if device < len(saved) else saved[0]
    module.set_rng_state(saved, device)
    if isinstance(layout, dict) and layout.get("device_count") != count:
        logger.warning("The checkpoint's %s RNG state was saved with %s visible %s device(s) (this rank on device "
                       "%s); this process sees %d and runs on device %d. Restored this rank's generator onto its "
                       "current device; random streams of other devices are not carried over, so dropout and "
                       "sampling on them differ from the uninterrupted run.", name, layout.get("device_count"),
                       name, layout.get("device"), count, device)


def _python_state_to_lists(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]
