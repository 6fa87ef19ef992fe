"""Issue 13 item 8 (and the registry-target weak case): one bad plugin cannot take twinkle down.

Each plugin here is a real distribution (a ``*.dist-info`` with ``entry_points.txt`` on sys.path), found
through ``importlib.metadata`` exactly as an installed one is.
"""

from __future__ import annotations

import textwrap
import uuid
import warnings

import pytest

from twinkle.plugins import TwinklePluginWarning, create_plugin_manager
from twinkle.registry import Registry, set_registry


@pytest.fixture
def site(tmp_path, monkeypatch):
    """site(dist, {ep_name: module}, {module: source}) installs a distribution into a fresh sys.path entry."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))

    def install(dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[twinkle]\n{lines}\n")
        for module, source in modules.items():
            (root / f"{module}.py").write_text(textwrap.dedent(source))

    return install


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _losses_plugin(name: str, target: str = "torch.nn:L1Loss") -> str:
    return f"""
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def register_losses():
            return {{{name!r}: {target!r}}}
    """


def _registry() -> tuple[Registry, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry = Registry(create_plugin_manager())
        registry.names("loss")
        registry.names("platform")
    return registry, [str(w.message) for w in caught if issubclass(w.category, TwinklePluginWarning)]


def _builtins_work(registry: Registry) -> None:
    assert registry.resolve("loss", "CrossEntropyLoss").__name__ == "CrossEntropyLoss"
    assert registry.resolve("optimizer", "AdamW").__name__ == "AdamW"
    assert registry.get("model", "TransformersModel").distribution == "twinkle-hf"


def test_a_plugin_raising_systemexit_at_import_is_skipped(site) -> None:
    good, bad = _unique("good"), _unique("exits")
    site("good-plugin", {"good": good}, {good: _losses_plugin("GoodLoss")})
    site("exiting-plugin", {"exits": bad}, {bad: "raise SystemExit(3)\n"})
    registry, messages = _registry()
    assert any("exiting-plugin" in m and "SystemExit" in m for m in messages), messages
    assert registry.resolve("loss", "GoodLoss").__name__ == "L1Loss"
    _builtins_work(registry)


def test_two_distributions_with_one_entry_point_name_both_load(site) -> None:
    first, second = _unique("first"), _unique("second")
    site("alpha-dist", {"shared": first}, {first: _losses_plugin("AlphaLoss")})
    site("beta-dist", {"shared": second}, {second: _losses_plugin("BetaLoss", "torch.nn:MSELoss")})
    registry, messages = _registry()
    assert registry.resolve("loss", "AlphaLoss").__name__ == "L1Loss"
    assert registry.resolve("loss", "BetaLoss").__name__ == "MSELoss"
    assert {registry.get("loss", "AlphaLoss").distribution, registry.get("loss", "BetaLoss").distribution} == {
        "alpha-dist", "beta-dist"}
    assert len([m for m in messages if "'shared'" in m]) == 1, messages
    _builtins_work(registry)


def test_an_entry_point_naming_an_already_registered_module_is_skipped(site) -> None:
    module = _unique("shared_module")
    site("owner-dist", {"a_owner": module}, {module: _losses_plugin("OwnedLoss")})
    site("copycat-dist", {"b_copycat": module}, {})  # entry points load in name order: the owner first
    registry, messages = _registry()
    assert any("copycat-dist" in m and "already registered" in m for m in messages), messages
    assert registry.get("loss", "OwnedLoss").distribution == "owner-dist"
    _builtins_work(registry)


def test_a_hook_with_a_wrong_signature_is_skipped(site) -> None:
    wrong, good = _unique("wrong"), _unique("fine")
    site("wrong-signature-dist", {"wrong": wrong}, {wrong: """
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def register_losses(unexpected_argument):
            return {"NeverLoss": "torch.nn:L1Loss"}

        @hookimpl
        def register_metrics():
            return {"NeverMetric": "torch.nn:L1Loss"}
    """})
    site("fine-dist", {"fine": good}, {good: _losses_plugin("FineLoss")})
    registry, messages = _registry()
    assert any("wrong-signature-dist" in m and "unexpected_argument" in m for m in messages), messages
    assert "NeverLoss" not in registry.names("loss") and "NeverMetric" not in registry.names("metric")
    assert registry.resolve("loss", "FineLoss").__name__ == "L1Loss"
    _builtins_work(registry)


def test_a_platform_whose_is_available_raises_is_unavailable(site, monkeypatch) -> None:
    from twinkle.platform import CPUPlatform, detect_platform

    monkeypatch.delenv("TWINKLE_DEVICE", raising=False)

    module = _unique("boom_platform")
    site("boom-device-dist", {"boom": module}, {module: """
        from twinkle.hookspecs import hookimpl
        from twinkle.platform import Platform

        class BoomPlatform(Platform):
            name = "boom"
            device_type = "boom"
            priority = 100

            @classmethod
            def is_available(cls):
                raise RuntimeError("driver exploded")

        @hookimpl
        def register_platforms():
            return {"boom": __name__ + ":BoomPlatform"}
    """})
    registry, _ = _registry()
    old = set_registry(registry)
    try:
        with pytest.warns(TwinklePluginWarning, match=r"boom-device-dist.*is_available\(\).*driver exploded"):
            assert detect_platform() is CPUPlatform
    finally:
        set_registry(old)


def test_re_registering_a_builtin_name_without_override_keeps_the_builtin(site) -> None:
    module = _unique("hijack")
    site("hijack-dist", {"hijack": module}, {module: _losses_plugin("CrossEntropyLoss", "torch.nn:MSELoss")})
    registry, messages = _registry()
    from twinkle.loss import CrossEntropyLoss

    assert registry.resolve("loss", "CrossEntropyLoss") is CrossEntropyLoss
    assert any("hijack-dist" in m and "CrossEntropyLoss" in m and "override=True" in m for m in messages), messages


@pytest.mark.parametrize("kind,name,target", [
    ("model", "LenModel", "builtins:len"),
    ("platform", "LenPlatform", "builtins:len"),
    ("loss", "ModuleLoss", "torch:nn"),
    ("optimizer", "ConstantOptimizer", "math:pi"),
])
def test_registry_targets_of_the_wrong_kind_are_refused(site, kind, name, target) -> None:
    from twinkle.errors import ComponentLoadError

    module = _unique("wrongkind")
    from twinkle.registry import KINDS

    hook = KINDS[kind]
    site("wrong-kind-dist", {"wk": module}, {module: f"""
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def {hook}():
            return {{{name!r}: {target!r}}}
    """})
    registry, _ = _registry()
    with pytest.raises(ComponentLoadError, match=rf"{kind} {name!r} from wrong-kind-dist.*{target}.*is not"):
        registry.resolve(kind, name)
