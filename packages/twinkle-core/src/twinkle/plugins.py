"""Loading plugins: core's built-in one plus every ``twinkle`` entry point that imports cleanly.

A third-party plugin that raises on import costs one warning naming it; the others still load.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import pluggy

from twinkle import hookspecs
from twinkle.version import __version__

ENTRY_POINT_GROUP = "twinkle"
DISABLE_ENV = "TWINKLE_DISABLE_PLUGINS"  # comma-separated entry-point names to skip


class TwinklePluginWarning(UserWarning):
    """A plugin could not be loaded or returned something unusable; it was skipped."""


@dataclass(frozen=True)
class Provenance:
    """Where a plugin comes from: the distribution that declared it and its version."""

    plugin_name: str
    distribution: str
    version: str


def _core_provenance() -> Provenance:
    try:
        version = importlib.metadata.version("twinkle-core")
    except importlib.metadata.PackageNotFoundError:
        version = __version__
    return Provenance("twinkle", "twinkle-core", version)


class TwinklePluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers which distribution provided each plugin."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.provenance: dict[str, Provenance] = {}
        self.failed: dict[str, str] = {}

    def register_plugin(self, plugin: object, provenance: Provenance) -> None:
        self.register(plugin, name=provenance.plugin_name)
        self.provenance[provenance.plugin_name] = provenance

    def provenance_of(self, plugin: object) -> Provenance:
        name = self.get_name(plugin) or repr(plugin)
        return self.provenance.get(name, Provenance(name, "<unregistered>", "?"))


def _disabled_names() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def load_entry_point_plugins(pm: TwinklePluginManager) -> None:
    """Register every installed ``twinkle`` entry point; warn about and skip the broken ones.

    A plugin that raises anything but KeyboardInterrupt at import (SystemExit included), whose hooks
    pluggy refuses (wrong signature), or that names a module another plugin already registered costs
    one warning naming its distribution; every other plugin still loads. Two distributions using one
    entry-point name both load (the second under ``name@distribution``).
    """
    disabled = _disabled_names()
    for ep in sorted(_entry_points(), key=lambda e: (e.name, _distribution(e)[0])):
        dist, version = _distribution(ep)
        if ep.name in disabled:
            continue
        name = ep.name
        if pm.has_plugin(name):
            name = f"{ep.name}@{dist}"
            _warn(f"twinkle plugin name {ep.name!r} is used by more than one distribution; the one from {dist} "
                  f"{version} is registered as {name!r}. Ask its authors for a unique entry-point name.")
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken third-party plugin must not take the others down
            _skip(pm, name, ep, dist, version, "failed to import", exc)
            continue
        if pm.is_registered(plugin):
            _warn(f"twinkle plugin {ep.name!r} ({ep.value}) from {dist} {version} names a module that is already "
                  f"registered (as {pm.get_name(plugin)!r}); it was skipped (its hooks are active once already).")
            continue
        try:
            pm.register_plugin(plugin, Provenance(name, dist, version))
        except pluggy.PluginValidationError as exc:
            if pm.has_plugin(name):
                pm.unregister(name=name)  # pluggy may have added some of its hooks before refusing one
            _skip(pm, name, ep, dist, version, "has a hook pluggy refuses", exc)


def _distribution(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    if ep.dist is None:
        return "<unknown>", "?"
    return ep.dist.metadata["Name"], ep.dist.version


def _warn(message: str) -> None:
    warnings.warn(message, TwinklePluginWarning, stacklevel=3)


def _skip(pm: TwinklePluginManager, name: str, ep: importlib.metadata.EntryPoint, dist: str, version: str,
          what: str, exc: BaseException) -> None:
    message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    pm.failed[name] = message
    _warn(f"twinkle plugin {ep.name!r} ({ep.value}) from {dist} {version} {what} and was skipped: {message}. "
          f"Reinstall or uninstall {dist}, or set {DISABLE_ENV}={ep.name}.")


def create_plugin_manager(
    *, entry_points: bool = True, extra: Iterable[tuple[object, Provenance]] = ()
) -> TwinklePluginManager:
    """Build a manager holding core's built-in plugin, the installed plugins and ``extra`` ones."""
    from twinkle import _builtin

    pm = TwinklePluginManager()
    pm.register_plugin(_builtin, _core_provenance())
    if entry_points:
        load_entry_point_plugins(pm)
    for plugin, provenance in extra:
        pm.register_plugin(plugin, provenance)
    return pm
