"""Peak tensor memory of a block of code on any device, CPU included (no torch.cuda needed).

A dispatch mode sees every op's outputs; each new storage is counted until it is freed (a weakref
finalizer on the storage), views and in-place results are not counted twice. This measures what
tensors hold, not what the allocator caches, which is the quantity a memory optimisation changes.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorMemoryTracker(TorchDispatchMode):
    """``with TensorMemoryTracker() as t: ...`` then ``t.peak_bytes`` / ``t.largest_bytes``.

    ``peak_bytes``: most bytes of storages created inside the block that were alive at once.
    ``largest_bytes`` / ``largest_shape``: the biggest single storage created inside the block.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.largest_bytes = 0
        self.largest_shape: tuple[int, ...] = ()
        self._live: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._live:
            self._live.discard(key)
            self.live_bytes -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self._live:
                continue
            nbytes = storage.nbytes()
            self._live.add(key)
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if nbytes > self.largest_bytes:
                self.largest_bytes, self.largest_shape = nbytes, tuple(t.shape)
            weakref.finalize(storage, self._free, key, nbytes)
        return out
