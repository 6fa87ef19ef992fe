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
        from twinkle import __version__ as version
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
    """Register every installed ``twinkle`` entry point; warn about and skip the broken ones."""
    disabled = _disabled_names()
    seen: set[str] = set()
    for ep in sorted(_entry_points(), key=lambda e: e.name):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else "<unknown>"
        version = ep.dist.version if ep.dist is not None else "?"
        if ep.name in disabled or ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party plugin must not take the others down
            message = f"{type(exc).__name__}: {exc}"
            pm.failed[ep.name] = message
            warnings.warn(
                f"twinkle plugin {ep.name!r} ({ep.value}) from {dist} {version} failed to import and was "
                f"skipped: {message}. Reinstall or uninstall {dist}, or set {DISABLE_ENV}={ep.name}.",
                TwinklePluginWarning,
                stacklevel=2,
            )
            continue
        pm.register_plugin(plugin, Provenance(ep.name, dist, version))


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
