"""Running megatron-core on a machine without CUDA: the adjustments, applied only when CUDA is absent.

megatron-core 0.16 allocates its scratch tensors on ``torch.cuda.current_device()`` (rotary
frequencies, the tensor-parallel gather buffers, ``GlobalMemoryBuffer``) and seeds layers through a
CUDA RNG tracker. On a CPU-only torch both raise. :func:`enable` makes, for this process only:

* ``torch.cuda.current_device()`` return ``torch.device('cpu')`` (it could only raise here, so no
  working code changes behaviour), which sends those allocations to the CPU;
* the tensor-parallel RNG tracker the inference tracker (no CUDA generator states), with
  ``torch.manual_seed`` as the only generator;
* megatron's ``jit_fuser`` functions (``torch.compile``: Qwen3.5's attention output gate, L2 norm, gelu)
  run eagerly. On CPU inductor would compile C++ for each of them in every process, and under
  ``ATEN_CPU_CAPABILITY=default`` it emits vector code that does not compile (``CppCompileError``);
  a model small enough for a CPU gains nothing from the fusion.

Hard-coded ``device='cuda'`` sites remain (the pipeline schedules, ``DistributedOptimizer``,
``clip_grads``, the default causal mask); twinkle never reaches them on CPU: it passes an explicit
attention mask and trains with a plain torch optimizer there (see docs/megatron.md).
"""

from __future__ import annotations

import sys
from typing import Any

_saved: dict[str, Any] = {}
#: (owner, attribute, the compiled callable) of every jit_fuser function made eager, to put back
_compiled: list[tuple[Any, str, Any]] = []


def needed() -> bool:
    import torch

    return not torch.cuda.is_available()


def _cpu_device() -> Any:
    import torch

    return torch.device("cpu")


def enable() -> bool:
    """Apply the adjustments if this process has no CUDA; returns whether they are active. Idempotent."""
    if not needed():
        return False
    import torch

    if "current_device" not in _saved:
        _saved["current_device"] = torch.cuda.current_device
        torch.cuda.current_device = _cpu_device
    reset_rng_tracker()
    run_fusers_eagerly()
    return True


def run_fusers_eagerly() -> None:
    """megatron's ``jit_fuser`` functions as written: later imports get the no-op decorator, and the
    functions megatron has compiled already (module functions, methods) are replaced by their originals."""
    from megatron.core import jit

    if "jit_fuser" not in _saved:
        _saved["jit_fuser"] = jit.jit_fuser
        jit.disable_jit_fuser()
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("megatron.core"):
            continue
        for owner in [module, *(v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name)]:
            for attr, value in list(vars(owner).items()):
                original = getattr(value, "_torchdynamo_orig_callable", None)
                if original is not None:
                    _compiled.append((owner, attr, value))
                    setattr(owner, attr, original)


def reset_rng_tracker() -> None:
    """Replace megatron's CUDA RNG tracker by the inference tracker (call after model-parallel init)."""
    from megatron.core import tensor_parallel

    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def disable() -> None:
    """Undo :func:`enable` (tests use it to leave the process as they found it)."""
    import torch

    if "current_device" in _saved:
        torch.cuda.current_device = _saved.pop("current_device")
    while _compiled:
        owner, attr, compiled = _compiled.pop()
        setattr(owner, attr, compiled)
    if "jit_fuser" in _saved:
        from megatron.core import jit

        jit.jit_fuser = _saved.pop("jit_fuser")


def active() -> bool:
    return "current_device" in _saved
