"""What every backend's multi-LoRA model shares about a tenant: :class:`TenantSpec`, how a tenant uses
its slot (rank, scaling, dropout, targeted layers)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


@dataclass
class TenantSpec:
    """How one tenant uses its slot: rank, scaling, dropout, the layers it targets (and backend details)."""

    slot: str
    r: int
    scaling: float
    dropout: float
    targets: frozenset[str]
    #: the backend's names for the targeted module kinds (Megatron's linear suffixes), if it needs them
    suffixes: list[str] = field(default_factory=list)

    @classmethod
    def from_config(cls, slot: str, config: Any, targets: frozenset[str], suffixes: list[str] | None = None
                    ) -> TenantSpec:
        """The spec of a peft ``LoraConfig``: ``lora_alpha / r`` (``/ sqrt(r)`` with rslora) as scaling."""
        r = int(config.r)
        scaling = float(config.lora_alpha) / (math.sqrt(r) if config.use_rslora else r)
        return cls(slot, r, scaling, float(config.lora_dropout or 0.0), frozenset(targets), list(suffixes or []))

    def zero_unused(self, layer: str, a: Any, b: Any) -> None:
        """Zero what the tenant does not train in ``layer``'s slot weights (in place, under no_grad).

        ``a`` is ``(max_r, in)``, ``b`` ``(out, max_r)``: ranks ``>= r`` are zeroed, and all of both
        where the tenant does not target the layer, so the slot holds exactly an r-rank adapter.
        """
        if layer in self.targets:
            a[self.r:].zero_()
            b[:, self.r:].zero_()
        else:
            a.zero_()
            b.zero_()

    def check_fits(self, tensors: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], where: str) -> None:
        """Refuse adapter ``tensors`` whose keys or shapes differ from the tenant's (``expected``), naming both."""
        differ = sorted(set(tensors) ^ set(expected))[:3]
        shapes = [f"{k}: file {tuple(v.shape)} vs tenant {expected[k]}" for k, v in tensors.items()
                  if k in expected and tuple(v.shape) != tuple(expected[k])][:2]
        if differ or shapes:
            raise CheckpointError(f"The adapter in {where!r} does not fit tenant slot {self.slot!r} (r={self.r}, "
                                  f"{len(self.targets)} layers): key differences {differ}, shape mismatches "
                                  f"{shapes}. Load it into a tenant acquired with the adapter's own LoraConfig.")

