"""KernelChoice: one provider's implementation of one op, for some devices, when available.

A choice is plain data that plugins register (kind ``kernel``). Its callables may be given as lazy
``"module:attr"`` strings so that listing or assembling chains imports nothing heavy; they are
imported only when the choice is actually applied.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: ``devices`` entry meaning "every device" (the torch reference choices use it).
ANY_DEVICE = "*"

Ref = Callable[..., Any] | str | None


class KernelNotApplicable(Exception):
    """Raised by a kernel for inputs it does not handle, so the caller uses the next choice instead."""


def load_ref(ref: Any) -> Any:
    """A ``"module:attr.sub"`` string imported and looked up; anything else returned as is."""
    if not isinstance(ref, str):
        return ref
    module_name, _, attr_path = ref.partition(":")
    if not module_name or not attr_path:
        raise ValueError(f"Kernel reference {ref!r} must look like 'package.module:attribute'.")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class KernelChoice:
    """How ``provider`` implements ``op`` on ``devices``.

    Exactly one of the ways to apply it may be set, or none for a *reference* choice that keeps
    the model's own code (the torch choices of module-level ops):

    - ``forward``: a function ``forward(module, *args, **kwargs)`` bound as the matched module's
      forward (module ops: ``rms_norm``, ``swiglu``);
    - ``module_class``: a class swapped in as the matched module's ``__class__``;
    - ``function``: a plain function. For ``rotary_embedding`` / ``attention`` it replaces the
      global the matched module's forward calls (``apply_rotary_pos_emb`` / the attention
      interface); for the loss-level ops (``cross_entropy``, ``fused_linear_cross_entropy``)
      kernelize only selects it and losses call it.

    ``available()`` says whether the provider can run here (library importable, device present);
    ``accepts(module)`` whether it implements this particular module's semantics. Neither may be
    trusted not to raise, so :meth:`is_available` / :meth:`accepts_module` turn errors into False.
    Chains are ordered by ``priority``, highest first (npu 300, liger 200, torch 0).
    """

    provider: str
    op: str
    devices: tuple[str, ...] = (ANY_DEVICE,)
    available: Ref = None
    forward: Ref = None
    module_class: Any = None
    function: Ref = None
    accepts: Ref = None
    priority: int = 100
    name: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.devices, str):
            object.__setattr__(self, "devices", (self.devices,))
        else:
            object.__setattr__(self, "devices", tuple(self.devices))
        if not self.name:
            object.__setattr__(self, "name", f"{self.provider}.{self.op}")
        ways = [w for w in ("forward", "module_class", "function") if getattr(self, w) is not None]
        if len(ways) > 1:
            raise ValueError(f"KernelChoice {self.name!r} sets {' and '.join(ways)}; set at most one.")

    @property
    def is_reference(self) -> bool:
        """True when applying it changes nothing (the model keeps its own implementation)."""
        return self.forward is None and self.module_class is None and self.function is None

    def supports_device(self, device: str) -> bool:
        return ANY_DEVICE in self.devices or device in self.devices

    def is_available(self, device: str | None = None) -> bool:
        """Supports ``device`` (if given) and the availability check passes; never raises."""
        if device is not None and not self.supports_device(device):
            return False
        if self.available is None:
            return True
        try:
            return bool(load_ref(self.available)())
        except Exception:
            return False

    def accepts_module(self, module: Any) -> bool:
        """Whether this choice implements ``module``'s semantics (True when no check is given); never raises."""
        if self.accepts is None:
            return True
        try:
            return bool(load_ref(self.accepts)(module))
        except Exception:
            return False

    def load_forward(self) -> Callable[..., Any] | None:
        return load_ref(self.forward)

    def load_class(self) -> type | None:
        return load_ref(self.module_class)

    def load_function(self) -> Callable[..., Any] | None:
        return load_ref(self.function)

    def __repr__(self) -> str:
        return f"KernelChoice({self.name!r}, devices={self.devices}, priority={self.priority})"
