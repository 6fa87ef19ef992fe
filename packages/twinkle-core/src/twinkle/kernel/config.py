"""Kernel configs: op -> ordered chain of KernelChoice, and the default one built from the registry."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from twinkle.kernel.choice import KernelChoice
from twinkle.kernel.ops import OPS, canonical_op

Chain = tuple[KernelChoice, ...]
ConfigLike = Mapping[str, "KernelChoice | str | Sequence[KernelChoice | str]"]


def _resolve_choice(item: KernelChoice | str, registry: Any = None) -> KernelChoice:
    if isinstance(item, KernelChoice):
        return item
    if isinstance(item, str):
        from twinkle.registry import get_registry

        obj = (registry or get_registry()).load("kernel", item)
        if isinstance(obj, KernelChoice):
            return obj
        raise TypeError(f"kernel {item!r} is a {type(obj).__name__}, not a twinkle.kernel.KernelChoice.")
    raise TypeError(f"A kernel chain holds KernelChoice objects or registered kernel names, got {item!r}.")


def normalize_config(config: ConfigLike, registry: Any = None) -> dict[str, Chain]:
    """A user config with aliases, names and single choices turned into ``{op: (choice, ...)}``, checked."""
    chains: dict[str, Chain] = {}
    for key, value in config.items():
        op = canonical_op(key)
        items: Iterable[Any] = (value,) if isinstance(value, (KernelChoice, str)) else value
        chain = tuple(_resolve_choice(item, registry) for item in items)
        wrong = [c.name for c in chain if c.op != op]
        if wrong:
            raise ValueError(f"The chain for {key!r} holds choices for other ops: {', '.join(wrong)}.")
        chains[op] = chains.get(op, ()) + chain
    return chains


def build_default_config(registry: Any = None) -> dict[str, Chain]:
    """Every registered KernelChoice, grouped by op, highest ``priority`` first (ties: registration order)."""
    from twinkle.plugins import TwinklePluginWarning
    from twinkle.registry import get_registry

    registry = registry or get_registry()
    found: list[KernelChoice] = []
    for component in registry.components("kernel"):
        try:
            obj = registry.load("kernel", component.name)
        except Exception as exc:
            warnings.warn(f"kernel {component.name!r} from {component.distribution} could not be loaded and is left "
                          f"out of the default kernel chains: {exc}", TwinklePluginWarning, stacklevel=2)
            continue
        if not isinstance(obj, KernelChoice) or obj.op not in OPS:
            what = f"op {obj.op!r} is unknown" if isinstance(obj, KernelChoice) else f"a {type(obj).__name__}"
            warnings.warn(f"kernel {component.name!r} from {component.distribution} is {what}, not a KernelChoice "
                          f"for one of {', '.join(OPS)}; it is left out of the default kernel chains.",
                          TwinklePluginWarning, stacklevel=2)
            continue
        found.append(obj)
    order = {id(c): i for i, c in enumerate(found)}
    chains: dict[str, Chain] = {}
    for op in OPS:
        members = sorted((c for c in found if c.op == op), key=lambda c: (-c.priority, order[id(c)]))
        if members:
            chains[op] = tuple(members)
    return chains


class _DefaultKernelConfig(Mapping[str, Chain]):
    """``DEFAULT_KERNEL_CONFIG``: a read-only mapping built from the registry on first access.

    Building it imports each choice's small descriptor module, never torch_npu or liger-kernel
    (their availability is checked only when a chain is used). It is rebuilt when the process-wide
    registry is replaced.
    """

    def __init__(self) -> None:
        self._chains: dict[str, Chain] | None = None
        self._registry: Any = None
        self._lock = threading.Lock()

    def _data(self) -> dict[str, Chain]:
        from twinkle.registry import get_registry

        registry = get_registry()
        with self._lock:
            if self._chains is None or self._registry is not registry:
                self._chains, self._registry = build_default_config(registry), registry
            return self._chains

    def refresh(self) -> None:
        """Forget the built chains (after installing a plugin in-process, say)."""
        with self._lock:
            self._chains = None

    def __getitem__(self, op: str) -> Chain:
        return self._data()[canonical_op(op)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        if self._chains is None:
            return "DEFAULT_KERNEL_CONFIG(<built from the registry on first use>)"
        body = ", ".join(f"{op}: [{', '.join(c.name for c in chain)}]" for op, chain in self._chains.items())
        return f"DEFAULT_KERNEL_CONFIG({body})"


DEFAULT_KERNEL_CONFIG = _DefaultKernelConfig()


def chain_for(op: str, config: ConfigLike | None = None) -> Chain:
    """The chain of ``op`` in ``config`` (default: DEFAULT_KERNEL_CONFIG); empty if the config has none."""
    op = canonical_op(op)
    if config is None or config is DEFAULT_KERNEL_CONFIG:
        return DEFAULT_KERNEL_CONFIG._data().get(op, ())
    return normalize_config(config).get(op, ())


def available_choices(op: str, device: str, config: ConfigLike | None = None) -> list[KernelChoice]:
    """The choices of ``op``'s chain that can run on ``device`` now, in chain order."""
    return [c for c in chain_for(op, config) if c.is_available(device)]


def select_choice(op: str, device: str, config: ConfigLike | None = None, module: Any = None) -> KernelChoice | None:
    """The first available choice for ``device`` (that accepts ``module``, if given), or None."""
    for choice in available_choices(op, device, config):
        if module is None or choice.accepts_module(module):
            return choice
    return None


def kernel_function(op: str, device: str = "cpu", config: ConfigLike | None = None) -> Any:
    """The function of the first available choice of a function-level op (e.g. fused_linear_cross_entropy)."""
    for choice in available_choices(op, device, config):
        if choice.function is not None:
            return choice.load_function()
    raise LookupError(f"No available kernel choice provides a function for {op!r} on {device!r}; "
                      f"the chain is [{', '.join(c.name for c in chain_for(op, config))}].")
