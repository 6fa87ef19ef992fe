"""The component registry: one table per kind, filled by plugin hooks, resolved lazily.

Every API that accepts a component by name (``set_loss('CrossEntropyLoss')``,
``set_optimizer('AdamW')``, ``twinkle.model.TransformersModel``) goes through :func:`resolve`.
Listing components imports nothing heavy: a spec is a ``"module:attribute"`` string that is
imported on first resolution only.
"""

from __future__ import annotations

import difflib
import importlib
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import (
    ComponentLoadError,
    ComponentNotFoundError,
    DuplicateComponentError,
    MissingBackendError,
    UnknownKindError,
)
from twinkle.plugins import Provenance, TwinklePluginManager, TwinklePluginWarning, create_plugin_manager

#: kind -> the hook that fills it (see twinkle.hookspecs)
KINDS: dict[str, str] = {
    "model": "register_models",
    "loss": "register_losses",
    "metric": "register_metrics",
    "optimizer": "register_optimizers",
    "lr_scheduler": "register_lr_schedulers",
    "template": "register_templates",
    "preprocessor": "register_preprocessors",
    "processor": "register_processors",
    "patch": "register_patches",
    "kernel": "register_kernels",
    "precision": "register_precisions",
    "platform": "register_platforms",
    "sampler": "register_samplers",
    "advantage": "register_advantages",
    "reward": "register_rewards",
    "command": "register_commands",
    "prober": "register_probers",
}

#: Components of twinkle's own packages, so a missing one names the package to install.
KNOWN_PROVIDERS: dict[tuple[str, str], str] = {
    ("model", "TransformersModel"): "twinkle-hf",
    ("model", "MultiLoraTransformersModel"): "twinkle-hf",
    ("model", "MegatronModel"): "twinkle-megatron",
    ("model", "MultiLoraMegatronModel"): "twinkle-megatron",
    ("optimizer", "MegatronDistributedOptimizer"): "twinkle-megatron",
    ("lr_scheduler", "OptimizerParamScheduler"): "twinkle-megatron",
    ("loss", "LigerFusedLinearCrossEntropyLoss"): "twinkle-hf",
    ("precision", "fp8"): "twinkle-megatron[fp8]",
    ("precision", "torchao.fp8"): "twinkle-hf[fp8]",
    ("platform", "npu"): "twinkle-npu",
    ("sampler", "TorchSampler"): "twinkle-hf",
    ("sampler", "VLLMSampler"): "twinkle-hf[vllm]",
    ("command", "serve"): "twinkle-server",
}


#: Distributions whose components a third-party plugin cannot displace without ``override=True``.
FIRST_PARTY = frozenset({"twinkle-core", "twinkle-hf", "twinkle-megatron", "twinkle-npu", "twinkle-server"})
#: Callable kinds: a name must resolve to a class or function, never a module or a constant.
CALLABLE_KINDS = frozenset({"loss", "metric", "optimizer", "lr_scheduler", "template", "preprocessor", "processor",
                            "patch", "prober"})


@dataclass(frozen=True)
class ComponentSpec:
    """What a hook may return instead of a bare ``"module:attr"`` string.

    ``override=True`` lets a plugin replace a name another plugin registered (for instance a
    faster loss under the same name); without it two registrations of one name are an error.
    """

    target: str
    override: bool = False
    description: str = ""


@dataclass(frozen=True)
class Component:
    """One registered component: where it lives and who provides it."""

    kind: str
    name: str
    target: str
    provider: Provenance
    override: bool = False
    description: str = ""

    @property
    def distribution(self) -> str:
        return self.provider.distribution

    @property
    def version(self) -> str:
        return self.provider.version


@dataclass
class _KindTable:
    components: dict[str, Component] = field(default_factory=dict)
    conflicts: dict[str, list[Component]] = field(default_factory=dict)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UnknownKindError(f"Unknown component kind {kind!r}; twinkle knows: {', '.join(KINDS)}.")


def _as_spec(value: object) -> ComponentSpec | None:
    if isinstance(value, ComponentSpec):
        spec = value
    elif isinstance(value, str):
        spec = ComponentSpec(value)
    else:
        return None
    module, _, attr = spec.target.partition(":")
    return spec if module and attr else None


def _keeps_first_party(old: Component, new: Component) -> bool:
    """A plugin registering a first-party name without override=True does not displace it."""
    first = [c for c in (old, new) if c.distribution in FIRST_PARTY]
    return len(first) == 1 and not (old if first[0] is new else new).override


def _check_kind_of(kind: str, obj: Any) -> str | None:
    """Why ``obj`` cannot be a ``kind`` component (None when it can): models and platforms are classes,
    the callable kinds are classes or functions (never a module or a constant)."""
    import inspect

    if kind in ("model", "platform") and not isinstance(obj, type):
        return "is not a class"
    if kind in CALLABLE_KINDS and (inspect.ismodule(obj) or not callable(obj)):
        return "is not a class or callable"
    return None


def _import_target(target: str) -> Any:
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    """Component tables built from a plugin manager's hooks; built on first use per kind."""

    def __init__(self, plugin_manager: TwinklePluginManager) -> None:
        self.plugin_manager = plugin_manager
        self._tables: dict[str, _KindTable] = {}
        self._loaded: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- tables
    def _table(self, kind: str) -> _KindTable:
        _check_kind(kind)
        with self._lock:
            if kind not in self._tables:
                self._tables[kind] = self._build(kind)
            return self._tables[kind]

    def _build(self, kind: str) -> _KindTable:
        table = _KindTable()
        hook = getattr(self.plugin_manager.hook, KINDS[kind])
        # hookimpls come last-registered first; walk in registration order so core comes first.
        for impl in reversed(hook.get_hookimpls()):
            provider = self.plugin_manager.provenance_of(impl.plugin)
            try:
                returned = impl.function()
            except Exception as exc:
                warnings.warn(
                    f"twinkle plugin {provider.plugin_name!r} from {provider.distribution} raised in "
                    f"{KINDS[kind]}() and its {kind} components were skipped: {type(exc).__name__}: {exc}",
                    TwinklePluginWarning,
                    stacklevel=3,
                )
                continue
            if returned is None:
                continue
            if not isinstance(returned, Mapping):
                warnings.warn(
                    f"twinkle plugin {provider.plugin_name!r} returned {type(returned).__name__} from "
                    f"{KINDS[kind]}(); expected a mapping name -> 'module:attr'. Skipped.",
                    TwinklePluginWarning,
                    stacklevel=3,
                )
                continue
            for name, value in returned.items():
                spec = _as_spec(value)
                if spec is None or not isinstance(name, str) or not name:
                    warnings.warn(
                        f"twinkle plugin {provider.plugin_name!r} registered {kind} {name!r} -> {value!r}; "
                        "a spec must be 'package.module:attribute' or ComponentSpec. Skipped.",
                        TwinklePluginWarning,
                        stacklevel=3,
                    )
                    continue
                self._add(table, Component(kind, name, spec.target, provider, spec.override, spec.description))
        return table

    @staticmethod
    def _add(table: _KindTable, new: Component) -> None:
        if new.name in table.conflicts:
            table.conflicts[new.name].append(new)
            return
        old = table.components.get(new.name)
        if old is not None and _keeps_first_party(old, new):
            kept, dropped = (old, new) if old.distribution in FIRST_PARTY else (new, old)
            table.components[new.name] = kept
            warnings.warn(
                f"twinkle plugin {dropped.provider.plugin_name!r} from {dropped.distribution} {dropped.version} "
                f"registers {new.kind} {new.name!r}, which {kept.distribution} provides; twinkle's own stays. To "
                "replace it on purpose, register ComponentSpec(..., override=True).",
                TwinklePluginWarning,
                stacklevel=4,
            )
            return
        if old is None or (new.override and not old.override):
            table.components[new.name] = new
        elif old.override and not new.override:
            return
        else:
            table.conflicts[new.name] = [old, new]
            del table.components[new.name]

    # ---------------------------------------------------------------- queries
    def components(self, kind: str | None = None) -> list[Component]:
        """Registered components (of one kind, or all), sorted by kind then name."""
        kinds = [kind] if kind is not None else list(KINDS)
        rows: list[Component] = []
        for k in kinds:
            rows.extend(sorted(self._table(k).components.values(), key=lambda c: c.name))
        return rows

    def conflicts(self, kind: str | None = None) -> dict[tuple[str, str], list[Component]]:
        kinds = [kind] if kind is not None else list(KINDS)
        return {(k, n): list(c) for k in kinds for n, c in self._table(k).conflicts.items()}

    def names(self, kind: str) -> list[str]:
        return sorted(self._table(kind).components)

    def get(self, kind: str, name: str) -> Component:
        """The component registered as ``name``, or an error explaining what to do."""
        table = self._table(kind)
        if name in table.components:
            return table.components[name]
        if name in table.conflicts:
            owners = "; ".join(
                f"{c.distribution} {c.version} (plugin {c.provider.plugin_name!r} -> {c.target})"
                for c in table.conflicts[name]
            )
            raise DuplicateComponentError(
                f"{kind} {name!r} is registered by more than one plugin: {owners}. Uninstall one of them, "
                "or have the one that should win register ComponentSpec(..., override=True)."
            )
        raise self._not_found(kind, name)

    def _not_found(self, kind: str, name: str) -> ComponentNotFoundError:
        package = KNOWN_PROVIDERS.get((kind, name))
        if package is not None:
            return MissingBackendError(
                f"{name} is provided by {package}, which is not installed: pip install {package}",
                kind=kind,
                name=name,
                package=package,
            )
        known = self.names(kind)
        parts = [f"Unknown {kind} {name!r}."]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        lowered = [k for k in known if k.lower() == name.lower()]
        if lowered or close:
            parts.append(f"Did you mean {' or '.join(repr(c) for c in (lowered or close))}?")
        parts.append(f"Known {kind} names: {', '.join(known) if known else '(none installed)'}.")
        elsewhere = [k for k in KINDS if k != kind and name in self._table(k).components]
        if elsewhere:
            parts.append(f"{name!r} is registered under kind {' and '.join(elsewhere)}, not {kind}.")
        parts.append("Pass a class or an instance instead, or install the plugin that provides it (`twinkle plugins`).")
        return ComponentNotFoundError(" ".join(parts), kind=kind, name=name)

    def register(self, kind: str, name: str, obj: Any) -> Any:
        """Add ``obj`` under ``name`` from a script, without a package (e.g. a reward function).

        It behaves like a plugin component (listed by ``twinkle plugins`` under distribution
        ``<script>``); a name some plugin already registered is an error, as between two plugins.
        Returns ``obj``, so it also works as a decorator body.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {kind} name must be a non-empty string, got {name!r}.")
        target = f"{getattr(obj, '__module__', '__main__')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        with self._lock:
            table = self._table(kind)
            if name in table.components or name in table.conflicts:
                owner = table.components.get(name) or table.conflicts[name][0]
                raise DuplicateComponentError(f"{kind} {name!r} is already registered by {owner.distribution} "
                                              f"({owner.target}); pick another name.")
            table.components[name] = Component(kind, name, target, Provenance("script", "<script>", ""))
            self._loaded[(kind, name)] = obj
        return obj

    def load(self, kind: str, name: str) -> Any:
        """Import and return the object registered as ``name`` (cached)."""
        component = self.get(kind, name)
        key = (kind, name)
        with self._lock:
            if key not in self._loaded:
                try:
                    obj = _import_target(component.target)
                except Exception as exc:
                    raise ComponentLoadError(
                        f"{kind} {name!r} from {component.distribution} {component.version} points to "
                        f"{component.target!r}, which failed to import ({type(exc).__name__}: {exc}). "
                        f"Reinstall {component.distribution} with its dependencies."
                    ) from exc
                problem = _check_kind_of(kind, obj)
                if problem:
                    raise ComponentLoadError(
                        f"{kind} {name!r} from {component.distribution} {component.version} points to "
                        f"{component.target!r}, which {problem} ({type(obj).__name__} {obj!r:.80}). The plugin "
                        f"registered the wrong object: report it to {component.distribution}'s authors."
                    )
                self._loaded[key] = obj
            return self._loaded[key]

    def resolve(self, kind: str, obj: Any) -> Any:
        """A name becomes its registered object; a class, an instance or a callable is returned as is."""
        _check_kind(kind)
        if isinstance(obj, str):
            return self.load(kind, obj)
        if obj is None:
            known = ", ".join(self.names(kind))
            raise TypeError(f"Expected a {kind} name, class or instance, got None. Known: {known}.")
        return obj


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry over core and every installed plugin (built on first call)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry(create_plugin_manager())
        return _registry


def set_registry(registry: Registry | None) -> Registry | None:
    """Replace the process-wide registry (``None`` rebuilds it on next use); returns the old one."""
    global _registry
    with _registry_lock:
        old, _registry = _registry, registry
        return old


def resolve(kind: str, obj: Any) -> Any:
    """Resolve ``obj`` of ``kind`` through the process-wide registry. See :meth:`Registry.resolve`."""
    return get_registry().resolve(kind, obj)


def register(kind: str, name: str, obj: Any) -> Any:
    """Register ``obj`` as ``kind`` ``name`` in the process-wide registry. See :meth:`Registry.register`."""
    return get_registry().register(kind, name, obj)


def list_components(kind: str | None = None) -> list[Component]:
    return get_registry().components(kind)
