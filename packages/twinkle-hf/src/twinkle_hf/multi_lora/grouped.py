"""The LoRA delta of several tenants' rows in one pass: two matmuls per layer, whatever the number of tenants.

For routes ``t = 1..K`` over row ranges of ``x`` (rank ``r_t <= r``, scaling ``s_t``), the slots' weights
are concatenated along the rank, ``A = [A_1[:r]; ...; A_K[:r]]`` (``K r x in``) and
``B = [B_1[:, :r], ..., B_K[:, :r]]`` (``out x K r``), and

    delta = ((x @ A.T) * M) @ B.T,     M[row, t r + j] = s_t if row is in route t and j < r_t, else 0

so a row of tenant t gets ``s_t (x A_t[:r_t].T) B_t[:, :r_t].T``, its own LoRA: the mask's zeros remove the
other tenants' columns exactly (a product with zero adds nothing to a sum, and its gradient to the other
tenants' weights is exactly zero), and a tenant that does not target the layer has no block. This is the
dense form of a segment (punica / S-LoRA) matmul; at LoRA ranks the extra ``K r`` columns cost less than the
per-tenant launches they replace (the base layer's matmul is ``in x out``), and no grouped-GEMM kernel is
needed, so it runs the same on every device. Only the order of the sums differs from one tenant at a time.

The mask depends on the routes only, so it is built once on the host, copied without a host sync (pinned
memory, non-blocking) and reused for every layer and step with the same routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

_CACHE_SIZE = 64  # route layouts kept (a server sees a few batch compositions; each mask is rows x K r)


class GroupedDelta:
    """Builds the grouped LoRA delta of :mod:`module docstring <twinkle_hf.multi_lora.grouped>` and caches masks."""

    def __init__(self) -> None:
        self._masks: dict[tuple, torch.Tensor] = {}

    def __call__(self, module: Any, routes: Sequence[Any], name: str, x: torch.Tensor,
                 rows: int) -> torch.Tensor | None:
        """The delta of ``routes`` (``SlotRoute``s with row ranges) on layer ``name``; ``None`` if none targets it.

        Args:
            module: the peft LoRA layer (its ``lora_A``/``lora_B`` hold the slots).
            routes: the routes of this forward, each with ``start``/``stop`` rows of ``x``.
            name: the layer's module name (tenants target layers by name).
            x: the layer's input, rows first.
            rows: the number of rows of the output (rows outside every route get no delta).

        Returns:
            The delta in the LoRA weights' dtype (autocast's under autocast), shaped like the output.
        """
        used = [r for r in routes if name in r.spec.targets]
        if not used:
            return None
        rank = max(r.spec.r for r in used)
        a = torch.cat([module.lora_A[r.spec.slot].weight[:rank] for r in used])
        b = torch.cat([module.lora_B[r.spec.slot].weight[:, :rank] for r in used], dim=1)
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(a.dtype)
        x = self._dropout(x, used, module.training)
        h = F.linear(x, a)
        mask = self._mask(used, rank, rows, x.dim(), h.dtype, h.device)
        return F.linear(h * mask, b)

    def _mask(self, used: Sequence[Any], rank: int, rows: int, dims: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        key = (tuple((r.spec.slot, r.spec.r, r.spec.scaling, r.start, r.stop) for r in used), rank, rows, dims,
               dtype, device)
        mask = self._masks.get(key)
        if mask is None:
            host = torch.zeros(rows, len(used) * rank, dtype=dtype)
            for i, r in enumerate(used):
                host[r.start:r.stop, i * rank:i * rank + r.spec.r] = r.spec.scaling
            mask = to_device(host.view(rows, *([1] * (dims - 2)), len(used) * rank), device)
            if len(self._masks) >= _CACHE_SIZE:
                self._masks.clear()
            self._masks[key] = mask
        return mask

    @staticmethod
    def _dropout(x: torch.Tensor, used: Sequence[Any], training: bool) -> torch.Tensor:
        """Each route's dropout on its own rows (one call when the routes share a probability)."""
        probs = {r.spec.dropout for r in used}
        if not training or probs == {0.0}:
            return x
        if len(probs) == 1:
            return F.dropout(x, probs.pop(), training=True)
        keep = torch.ones(x.shape[0], *([1] * (x.dim() - 1)), dtype=x.dtype)
        for r in used:
            keep[r.start:r.stop] = 1.0 - r.spec.dropout
        keep = to_device(keep, x.device)
        return x * torch.bernoulli(keep.expand_as(x)) / keep


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without a host sync: a pageable copy would wait for the device's queue."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
