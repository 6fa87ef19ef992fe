"""A communication device that is not the CPU, and a spy on torch.distributed, for device-placement tests.

gloo takes tensors from any device, so a CPU test cannot tell whether a collective would crash
under NCCL. Here:

* ``fakeacc`` is a Python PrivateUse1 backend (``torch.utils.backend_registration``) whose
  tensors hold NumPy arrays. It implements only what a collective layer needs: allocation and
  copies to and from the CPU. Anything else on it fails loudly.
* :class:`FakeAccPlatform` is a twinkle platform whose models run on the CPU but whose
  ``comm_device()`` is ``fakeacc:0`` -- the situation of a CUDA rank, where NCCL wants ``cuda:N``.
* :class:`CollectiveSpy` wraps the torch.distributed collectives. For a call made by twinkle code it
  records the device of every tensor handed over, then runs the real gloo collective on CPU
  copies and copies the results back. Calls from torch's own internals (DDP, FSDP2, DCP) pass
  through untouched.

Call :func:`install` once per process, before ``twinkle.initialize(device="fakeacc")``; never in the
pytest process itself (the backend registration is process-wide).
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import numpy as np
import torch

DEVICE = "fakeacc"
TENSOR_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                      "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
                      "send", "recv", "isend", "irecv")
OBJECT_COLLECTIVES = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                      "barrier", "monitored_barrier")


class FakeAccTensor(torch.Tensor):
    """A ``fakeacc`` tensor: a NumPy array behind a storage-less tensor of the right shape and dtype."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data: np.ndarray) -> FakeAccTensor:
        dtype = torch.from_numpy(np.empty(0, dtype=data.dtype)).dtype
        tensor = torch._C._acc.create_empty_tensor(tuple(data.shape), dtype)
        tensor.__class__ = cls
        return tensor

    def __init__(self, data: np.ndarray) -> None:
        self.raw = data


def _numpy_dtype(dtype: torch.dtype | None) -> np.dtype:
    return torch.empty(0, dtype=dtype or torch.float32).numpy().dtype


def _register_ops() -> None:
    @torch.library.impl("aten::empty_strided", "privateuseone")
    def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
        return FakeAccTensor(np.zeros(tuple(size), dtype=_numpy_dtype(dtype)))

    @torch.library.impl("aten::empty.memory_format", "privateuseone")
    def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return FakeAccTensor(np.zeros(tuple(size), dtype=_numpy_dtype(dtype)))

    @torch.library.impl("aten::_copy_from", "privateuseone")
    def copy_from(src, dst, non_blocking=False):
        data = src.raw if src.device.type == DEVICE else src.detach().contiguous().numpy()
        if dst.device.type == DEVICE:
            dst.raw = np.array(data, dtype=dst.raw.dtype).reshape(dst.raw.shape)
        else:
            dst.copy_(torch.from_numpy(np.ascontiguousarray(data)).reshape(dst.shape))
        return dst

    @torch.library.impl("aten::detach", "privateuseone")
    def detach(tensor):
        return FakeAccTensor(tensor.raw)


class _BackendModule:
    """``torch.fakeacc``: reports itself unavailable, so torch's own code (DCP's writer) never picks it."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return False

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass


def _platform_class() -> type:
    from twinkle.platform import Platform

    class FakeAccPlatform(Platform):
        """Models on the CPU, collectives expected on ``fakeacc:0`` (like a CUDA rank under NCCL)."""

        name = DEVICE
        device_type = "cpu"
        dist_backend = "gloo"
        priority = -1

        @classmethod
        def is_available(cls) -> bool:
            return True

        @classmethod
        def device(cls, local_rank: int = 0) -> torch.device:
            return torch.device("cpu")

        @classmethod
        def comm_device(cls) -> torch.device:
            return torch.device(DEVICE, 0)

    return FakeAccPlatform


class CollectiveSpy:
    """Records what twinkle code hands to torch.distributed; see the module docstring."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        import torch.distributed as dist

        for name in (*TENSOR_COLLECTIVES, *OBJECT_COLLECTIVES):
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(name, real))

    def reset(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records

    def _wrap(self, name: str, real: Any) -> Any:
        @functools.wraps(real)
        def spy(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith("twinkle"):
                return real(*args, **kwargs)
            tensors = _tensors(args) + _tensors(list(kwargs.values()))
            self.records.append({"fn": name, "caller": caller, "devices": sorted({t.device.type for t in tensors})})
            if not any(t.device.type == DEVICE for t in tensors):
                return real(*args, **kwargs)
            copies: dict[int, torch.Tensor] = {}
            result = real(*_on_cpu(args, copies), **dict(zip(kwargs, _on_cpu(list(kwargs.values()), copies))))
            for tensor in tensors:
                if id(tensor) in copies:
                    tensor.copy_(copies[id(tensor)])
            return result

        return spy


def _tensors(values: list[Any] | tuple[Any, ...]) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += _tensors(value)
    return found


def _on_cpu(values: list[Any] | tuple[Any, ...], copies: dict[int, torch.Tensor]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type == DEVICE:
            copies[id(value)] = value.to("cpu")
            out.append(copies[id(value)])
        elif isinstance(value, list):
            out.append(_on_cpu(value, copies))
        else:
            out.append(value)
    return out


def install() -> CollectiveSpy:
    """Register the ``fakeacc`` device and platform in this process and spy on torch.distributed."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from twinkle.hookspecs import hookimpl
    from twinkle.plugins import Provenance, create_plugin_manager
    from twinkle.registry import Registry, set_registry

    _setup_privateuseone_for_python_backend(DEVICE, backend_module=_BackendModule())
    _register_ops()
    module = types.ModuleType("fakeacc_platform")
    module.FakeAccPlatform = _platform_class()
    sys.modules[module.__name__] = module
    plugin = types.SimpleNamespace(register_platforms=hookimpl(lambda: {DEVICE: "fakeacc_platform:FakeAccPlatform"}))
    set_registry(Registry(create_plugin_manager(extra=[(plugin, Provenance("fakeacc", "twinkle-tests", "0"))])))
    return CollectiveSpy()


def misplaced(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded calls that handed torch.distributed a tensor not on the communication device."""
    return [r for r in records if r["devices"] and r["devices"] != [DEVICE]]
