"""Multi-tenant models: many tenants' LoRA adapters trained on one shared base model.

:class:`MultiTenantModel` is the interface callers depend on (the service, a scheduler of tenants):
acquire / release / load a tenant, list tenants, and ``forward_backward_multi`` -- one step over
rows of several tenants. Both multi-LoRA models implement it through :class:`MultiTenantFacade`:
the TwinkleModel API of :class:`~twinkle.model.facade.ModelFacade` plus a tenant router
(:class:`twinkle.multi_lora.MultiLora`) that maps tenant names to their slots' optimizer groups.
Every TwinkleModel method takes ``adapter_name=`` = the tenant name or the slot name
``acquire_lora`` returned; a free slot's name, another name, or none outside an
``multi_lora.adapter()`` block is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from twinkle.engine import Route
from twinkle.model.facade import ModelFacade, locked
from twinkle.model.inputs import collate
from twinkle.multi_lora import LoraTenant, MultiLora
from twinkle.processor.input_processor import TOKEN_FIELDS

#: Keys stacked across tenants, with their padding value (RL rows add their per-token fields, padded with 0).
_PAD = {"input_ids": None, "attention_mask": 0, "labels": -100, "position_ids": 0,
        **{key: 0 for key in TOKEN_FIELDS}}


@runtime_checkable
class MultiTenantModel(Protocol):
    """What a multi-tenant model offers beside the TwinkleModel API (see the module docstring).

    Methods only, so ``issubclass(model_class, MultiTenantModel)`` answers for a class before it is built.
    """

    def acquire_lora(self, tenant: str, config: Any, *, seed: int | None = None) -> str:
        """Give ``tenant`` a free slot configured by ``config`` (a peft LoraConfig); returns the slot's name.
        ``seed`` re-initialises the tenant's LoRA deterministically, whatever slot it lands in."""

    def release_lora(self, tenant: str) -> None:
        """Free ``tenant``'s slot: its weights back to the initial state, its training state dropped."""

    def load_lora(self, tenant: str, directory: str | Path) -> str:
        """Acquire a slot for ``tenant`` with a saved PEFT adapter's config and weights; returns the slot's name."""

    def tenants(self) -> list[str]:
        """The tenants holding a slot, in slot order."""

    def forward_backward_multi(self, inputs: Mapping[str, Any], *, task: str = "causal_lm") -> dict[str, Any]:
        """One forward + backward over ``{tenant: batch}``; each tenant's per-token mean loss."""


class MultiTenantFacade(ModelFacade):
    """:class:`ModelFacade` with a tenant router; a backend's slots do the tensor work.

    Subclasses build the backend and its slots part (a :class:`twinkle.multi_lora.SlotBackend`), call
    :meth:`_attach` and then :meth:`_attach_tenants`.
    """

    def _attach_tenants(self, slots: Any, max_loras: int, max_r: int, slot_config: Any, max_length: int) -> None:
        self.max_length = max_length
        self.multi_lora = MultiLora(slots, max_loras, max_r, slot_config, lock=self.lock, groups=self.optimizer_group,
                                    on_activate=self._open_tenant, on_reset=self._close_tenant)
        self._router = self.multi_lora.group

    def _open_tenant(self, slot: LoraTenant) -> None:
        self.optimizer_group[slot.adapter_name] = self._new_group(slot.adapter_name, is_adapter=True)

    def _close_tenant(self, slot: LoraTenant) -> None:
        self.optimizer_group.pop(slot.adapter_name, None)

    # ------------------------------------------------------------------ tenants
    @locked
    def acquire_lora(self, tenant: str, config: Any, *, seed: int | None = None) -> str:
        """``multi_lora.acquire_lora`` as a model method (so a Ray proxy can call it); returns the slot name.

        ``seed`` re-initialises the tenant's LoRA deterministically (peft's init drawn from ``seed``),
        whatever slot it lands in; without it the tenant starts from the slot's initial weights.
        """
        with self.multi_lora.acquired(tenant, config) as name:
            if seed is not None:
                self.multi_lora.backend.seed_slot(name, seed)
        return name

    @locked
    def release_lora(self, tenant: str) -> None:
        """``multi_lora.release_lora`` as a model method: the slot's weights back to their initial state."""
        self.multi_lora.release_lora(tenant)

    @locked
    def load_lora(self, tenant: str, directory: str | Path) -> str:
        """Acquire a slot for ``tenant`` with a saved PEFT adapter's config and weights."""
        path = Path(directory).expanduser()
        slots = self.multi_lora.backend
        with self.multi_lora.acquired(tenant, slots.read_tenant_config(path)) as name:
            slots.load_slot(name, path)
        return name

    @locked
    def tenants(self) -> list[str]:
        """The tenants holding a slot, in slot order."""
        return self.multi_lora.names()

    @locked
    def forward_backward_multi(self, inputs: Mapping[str, Any], *, task: str = "causal_lm") -> dict[str, Any]:
        """One forward + backward for ``{tenant: batch}``; returns each tenant's per-token mean loss.

        Equivalent to ``forward_backward(inputs=batch, adapter_name=tenant)`` for every tenant (each
        group's accumulation, metrics and loss are updated the same way), in one pass: the tenants'
        rows are stacked (right-padded to the longest) and each row range runs through its tenant's
        LoRA only. Rows never interact in a transformer forward and the tenants' parameters are
        disjoint, so every tenant receives exactly the gradient of its own loss.
        """
        if task != "causal_lm":
            raise ValueError(f"forward_backward_multi supports task='causal_lm' only, got {task!r}; use "
                             "forward_backward per tenant for other tasks.")
        if not isinstance(inputs, Mapping) or not inputs:
            raise TypeError("forward_backward_multi takes a non-empty dict {tenant: batch}.")
        groups = {t: self._group(t) for t in inputs}
        if len({g.name for g in groups.values()}) != len(groups):
            raise ValueError(f"{list(inputs)} name the same tenant twice (tenant and slot names); give each "
                             "tenant once.")
        backend = self.backend
        batches = {t: collate(b, groups[t], backend.pad_token_id(groups[t]), backend.vocab_size, self.max_length)
                   for t, b in inputs.items()}
        merged, ranges = stack_batches(batches, {t: backend.pad_token_id(g) for t, g in groups.items()})
        pieces = backend.prepare(merged, next(iter(groups.values())), task, {})
        self._require_parallelized("forward_backward_multi")
        routes = [Route(groups[t], slice(start, stop)) for t, (start, stop) in ranges.items()]
        losses = self.engine.forward_backward(routes, pieces, task, {})
        return {t: losses[groups[t].name] for t in inputs}


def stack_batches(batches: dict[str, dict[str, Any]], pad_ids: dict[str, int]) -> tuple[dict[str, Any], dict]:
    """Right-pad every tenant's rows to one width and stack them; returns the row range of each tenant."""
    for t, batch in batches.items():
        extra = sorted(set(batch) - set(_PAD))
        if "position_ids" in batch and "attention_mask" not in batch:
            raise ValueError(f"Tenant {t!r}'s batch is packed (position_ids without attention_mask); "
                             "forward_backward_multi stacks padded rows: collate without padding_free.")
        if extra or "input_ids" not in batch:
            raise ValueError(f"Tenant {t!r}'s batch has keys {sorted(batch)}; forward_backward_multi stacks "
                             f"{', '.join(_PAD)} only (input_ids required).")
    width = max(b["input_ids"].shape[1] for b in batches.values())
    merged: dict[str, list[torch.Tensor]] = {}
    ranges, start = {}, 0
    for t, batch in batches.items():
        rows = batch["input_ids"].shape[0]
        batch = dict(batch)
        batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))
        for key, fill in _PAD.items():
            if key in batch:
                value = pad_ids[t] if fill is None else fill
                tensor = batch[key]
                merged.setdefault(key, []).append(
                    torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value))
        ranges[t] = (start, start + rows)
        start += rows
    if len({len(v) for v in merged.values()}) != 1:
        raise ValueError("Every tenant's batch needs the same keys (e.g. all with labels).")
    return {k: torch.cat(v) for k, v in merged.items()}, ranges
