"""Helpers for registry tests: plugins built in-process, registries without installed entry points."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from twinkle.hookspecs import hookimpl
from twinkle.plugins import Provenance, create_plugin_manager
from twinkle.registry import Registry


def _plugin_with(**hooks: dict) -> object:
    """An object whose register_<kind>s hooks return the given mappings."""
    namespace = {}
    for hook_name, specs in hooks.items():
        def impl(self, _specs=specs):
            return _specs

        impl.__name__ = hook_name
        namespace[hook_name] = hookimpl(impl)
    return type("InlinePlugin", (), namespace)()


@pytest.fixture
def plugin_with() -> Callable[..., object]:
    """plugin_with(register_losses={...}, ...) -> a plugin object with those hooks."""
    return _plugin_with


@pytest.fixture
def make_registry() -> Callable[..., Registry]:
    """make_registry((plugin, 'dist-name'), ...) -> Registry over core + those plugins only."""

    def build(*plugins: tuple[object, str], entry_points: bool = False) -> Registry:
        extra = [(p, Provenance(f"{dist}-plugin", dist, "1.0")) for p, dist in plugins]
        return Registry(create_plugin_manager(entry_points=entry_points, extra=extra))

    return build
