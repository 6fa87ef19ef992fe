"""MultiLora: tenants borrow pre-allocated LoRA slots of one shared base model.

Slots (``lora_0`` .. ``lora_{max_loras-1}``, rank ``max_r``) are created once, before any
DDP/FSDP wrapping, so a tenant added later trains parameters the wrapper already manages. This
module only does the bookkeeping; a backend does the tensor work through :class:`SlotBackend`:

* ``create_slot(tenant)``: build slot ``tenant.adapter_name`` (rank ``max_r``) and remember its
  initial weights;
* ``check_tenant_config(config) -> frozenset[str]``: validate a tenant's LoraConfig and return
  the modules it targets (the manager checks they lie inside ``slot_targets()``); must not change
  anything;
* ``activate_tenant(tenant)``: configure the slot for ``tenant.tenant_config`` (rank, scaling,
  dropout, targets) and create its training state (optimizer group);
* ``reset_slot(tenant)``: restore the slot's initial weights and drop its training state.

Every check runs before any state changes, so a bad call leaves all slots as they were. One
re-entrant lock (``self.lock``) serializes the backend's work: two threads driving two tenants
take turns call by call instead of interleaving. ``adapter(tenant)`` marks the tenant as this
thread's current one (thread-local), so calls without ``adapter_name`` inside the block use it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from twinkle.model.optimizer_group import check_adapter_name
from twinkle.utils.checks import check_int


@dataclass
class LoraTenant:
    """One slot: its internal adapter name and, while borrowed, the tenant holding it."""

    index: int
    adapter_name: str
    config: Any
    tenant_adapter_name: str | None = None
    tenant_config: Any = None

    @property
    def is_free(self) -> bool:
        return self.tenant_adapter_name is None


class SlotBackend(Protocol):
    """What a model backend implements for :class:`MultiLora` (see the module docstring)."""

    def slot_targets(self) -> frozenset[str]: ...

    def create_slot(self, tenant: LoraTenant) -> None: ...

    def check_tenant_config(self, config: Any) -> frozenset[str]: ...

    def activate_tenant(self, tenant: LoraTenant) -> None: ...

    def reset_slot(self, tenant: LoraTenant) -> None: ...

    # optional: ``complete_tenant_config(config) -> config`` fills defaults (peft's target_modules) first


class MultiLora:
    """Slot manager: ``acquire_lora`` / ``release_lora`` / ``adapter()`` / lookups by tenant."""

    def __init__(self, backend: SlotBackend, max_loras: int, max_r: int, slot_config: Any,
                 prefix: str = "lora_", *, lock: Any = None, on_activate: Callable[[LoraTenant], None] | None = None,
                 on_reset: Callable[[LoraTenant], None] | None = None, groups: Mapping[str, Any] | None = None) -> None:
        for option, value in (("max_loras", max_loras), ("max_r", max_r)):
            check_int(value, option)
        self.backend = backend
        self.max_loras = max_loras
        self.max_r = max_r
        self.lock = lock if lock is not None else threading.RLock()
        # what the model does when a slot gets or loses a tenant (its optimizer group), beside the slot's tensors
        self._on_activate = on_activate
        self._on_reset = on_reset
        #: the model's optimizer groups, keyed by slot name (what :meth:`group` resolves a name to)
        self.groups = groups if groups is not None else {}
        self._local = threading.local()
        self.tenants: list[LoraTenant] = [LoraTenant(i, f"{prefix}{i}", copy.deepcopy(slot_config))
                                         for i in range(max_loras)]
        for tenant in self.tenants:
            backend.create_slot(tenant)

    # ----------------------------------------------------------------- lifecycle
    def acquire_lora(self, tenant: str, config: Any) -> str:
        """Give ``tenant`` a free slot configured by ``config``; returns the slot's adapter name.

        RuntimeError when every slot is taken or ``config.r > max_r``; ValueError for a bad name,
        a name already holding a slot, or targets outside the slots'. Nothing changes on error.
        """
        with self.lock:
            self._check_name(tenant)
            if self.find(tenant) is not None:
                raise ValueError(f"Tenant {tenant!r} already holds slot {self.find(tenant).adapter_name!r}; "
                                 f"release_lora({tenant!r}) first or pick another tenant name.")
            r = getattr(config, "r", None)
            if isinstance(r, bool) or not isinstance(r, int) or r < 1:
                raise ValueError(f"The tenant config needs an integer rank r >= 1, got r={r!r}.")
            if r > self.max_r:
                raise RuntimeError(f"Tenant {tenant!r} asks for r={r} but the slots have max_r={self.max_r}; "
                                   f"use r <= {self.max_r} or build the model with a larger max_r.")
            complete = getattr(self.backend, "complete_tenant_config", None)
            if complete is not None:
                config = complete(config)
            targets = self.backend.check_tenant_config(config)
            outside = sorted(set(targets) - set(self.backend.slot_targets()))
            if outside:
                raise ValueError(f"Tenant {tenant!r}'s target_modules reach {len(outside)} modules the slots do not "
                                 f"cover (e.g. {outside[:3]}); choose target_modules among the slots' layers or build "
                                 "the model with wider target_modules.")
            if not targets:
                raise ValueError(f"Tenant {tenant!r}'s target_modules match no layer holding a slot.")
            free = next((t for t in self.tenants if t.is_free), None)
            if free is None:
                raise RuntimeError(f"All {self.max_loras} LoRA slots are taken (tenants: {', '.join(self.names())}); "
                                   "release_lora(...) one or build the model with a larger max_loras.")
            free.tenant_adapter_name, free.tenant_config = tenant, config
            try:
                self.backend.activate_tenant(free)
                if self._on_activate is not None:
                    self._on_activate(free)
            except BaseException:
                self._reset(free)
                raise
            return free.adapter_name

    @contextmanager
    def acquired(self, tenant: str, config: Any) -> Iterator[str]:
        """:meth:`acquire_lora` for a slot the block then fills (saved weights, a seeded init); yields its name.

        If the block raises, the slot is released again: a failed fill never leaves a half-made tenant.
        """
        with self.lock:
            name = self.acquire_lora(tenant, config)
            try:
                yield name
            except BaseException:
                self.release_lora(tenant)
                raise

    def release_lora(self, tenant: str) -> None:
        """Free ``tenant``'s slot: weights back to their initial state, training state dropped."""
        with self.lock:
            self._reset(self.get(tenant))

    def _reset(self, slot: LoraTenant) -> None:
        self.backend.reset_slot(slot)
        if self._on_reset is not None:
            self._on_reset(slot)
        slot.tenant_adapter_name = slot.tenant_config = None

    @contextmanager
    def adapter(self, tenant: str) -> Iterator[str]:
        """Make ``tenant`` this thread's current tenant inside the block; yields its slot's adapter name."""
        slot = self.get(tenant)
        stack = self._stack()
        stack.append(tenant)
        try:
            yield slot.adapter_name
        finally:
            stack.pop()

    # -------------------------------------------------------------------- lookups
    def find(self, tenant: str) -> LoraTenant | None:
        """The slot ``tenant`` holds, or None."""
        return next((t for t in self.tenants if t.tenant_adapter_name == tenant), None)

    def get(self, tenant: str) -> LoraTenant:
        """The slot ``tenant`` holds; a clear KeyError when it holds none."""
        slot = self.find(tenant) if isinstance(tenant, str) else None
        if slot is None:
            raise KeyError(f"No tenant named {tenant!r} holds a LoRA slot (tenants: {', '.join(self.names()) or 'none'}"
                           f"); acquire_lora({tenant!r}, LoraConfig(...)) first.")
        return slot

    def resolve(self, name: str | None) -> LoraTenant:
        """The slot for an ``adapter_name`` argument: a tenant name or a borrowed slot's adapter name.

        ``None`` means this thread's current tenant (``adapter()`` block). Free slots, unknown names
        and a missing name are errors -- never a fallback to some slot.
        """
        if name is None:
            stack = self._stack()
            if not stack:
                raise ValueError("This is a multi-tenant model: pass adapter_name=<tenant> or call inside "
                                 "`with model.multi_lora.adapter(<tenant>):`.")
            return self.get(stack[-1])
        slot = self.find(name)
        if slot is not None:
            return slot
        by_slot = next((t for t in self.tenants if t.adapter_name == name), None)
        if by_slot is not None and not by_slot.is_free:
            return by_slot
        if by_slot is not None:
            raise KeyError(f"Slot {name!r} is free (no tenant holds it); acquire_lora(tenant, config) first and use "
                           "the tenant name or the adapter name it returns.")
        return self.get(name)

    def group(self, name: str | None) -> Any:
        """The optimizer group of the slot :meth:`resolve` finds for ``name``."""
        return self.groups[self.resolve(name).adapter_name]

    def names(self) -> list[str]:
        """Tenants holding a slot, in slot order."""
        return [t.tenant_adapter_name for t in self.tenants if not t.is_free]

    def current(self) -> str | None:
        """This thread's current tenant (innermost ``adapter()`` block), or None."""
        stack = self._stack()
        return stack[-1] if stack else None

    def _stack(self) -> list[str]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _check_name(self, tenant: Any) -> None:
        check_adapter_name(tenant, "tenant")
        if any(t.adapter_name == tenant for t in self.tenants):
            raise ValueError(f"tenant={tenant!r} is the name of an internal slot; pick another tenant name.")
