"""Registry resolution, errors, duplicates and overrides, with plugins built in-process."""

from __future__ import annotations

import sys

import pytest
import torch

from twinkle.errors import (
    ComponentLoadError,
    ComponentNotFoundError,
    DuplicateComponentError,
    MissingBackendError,
    UnknownKindError,
)
from twinkle.plugins import TwinklePluginWarning
from twinkle.registry import KINDS, ComponentSpec


def test_builtin_names_resolve_to_the_real_objects(make_registry):
    reg = make_registry()
    assert reg.resolve("optimizer", "AdamW") is torch.optim.AdamW
    assert reg.resolve("optimizer", "Muon") is torch.optim.Muon
    assert reg.resolve("lr_scheduler", "CosineAnnealingLR") is torch.optim.lr_scheduler.CosineAnnealingLR
    from twinkle.loss import CrossEntropyLoss
    from twinkle.lr_scheduler import CosineWarmupScheduler
    from twinkle.platform import CPUPlatform

    assert reg.resolve("lr_scheduler", "CosineWarmupScheduler") is CosineWarmupScheduler
    assert reg.resolve("loss", "CrossEntropyLoss") is CrossEntropyLoss
    assert reg.resolve("platform", "cpu") is CPUPlatform
    component = reg.get("optimizer", "AdamW")
    assert (component.distribution, component.target) == ("twinkle-core", "torch.optim:AdamW")


def test_every_kind_resolves_a_plugin_component(make_registry, plugin_with):
    class Thing:
        pass

    module = sys.modules[__name__]
    module.ThingForTest = Thing
    hooks = {hook: {f"thing_{kind}": f"{__name__}:ThingForTest"} for kind, hook in KINDS.items()}
    reg = make_registry((plugin_with(**hooks), "thing-dist"))
    for kind in KINDS:
        assert reg.resolve(kind, f"thing_{kind}") is Thing
        assert f"thing_{kind}" in reg.names(kind)


def test_classes_instances_and_callables_pass_through(make_registry):
    reg = make_registry()
    loss = lambda inputs, outputs: 0  # noqa: E731
    instance = torch.nn.MSELoss()
    assert reg.resolve("loss", loss) is loss
    assert reg.resolve("loss", instance) is instance
    assert reg.resolve("optimizer", torch.optim.SGD) is torch.optim.SGD
    with pytest.raises(TypeError, match="got None"):
        reg.resolve("loss", None)


def test_unknown_name_lists_known_names_and_suggests(make_registry):
    reg = make_registry()
    with pytest.raises(ComponentNotFoundError) as info:
        reg.resolve("optimizer", "adamw")
    message = str(info.value)
    assert "Unknown optimizer 'adamw'" in message
    assert "Did you mean 'AdamW'" in message
    assert "SGD" in message and "Muon" in message
    assert info.value.kind == "optimizer" and info.value.name == "adamw"


def test_name_registered_under_another_kind_is_pointed_out(make_registry):
    with pytest.raises(ComponentNotFoundError, match="registered under kind optimizer, not loss"):
        make_registry().resolve("loss", "AdamW")


def test_unknown_kind(make_registry):
    with pytest.raises(UnknownKindError, match="twinkle knows: model, loss"):
        make_registry().resolve("optimiser", "AdamW")


@pytest.mark.parametrize(
    "kind, name, package",
    [
        ("model", "TransformersModel", "twinkle-hf"),
        ("model", "MegatronModel", "twinkle-megatron"),
        ("platform", "npu", "twinkle-npu"),
        ("precision", "fp8", "twinkle-megatron[fp8]"),
    ],
)
def test_first_party_name_without_its_backend_names_the_package(make_registry, kind, name, package):
    reg = make_registry()  # core only: no installed entry points
    with pytest.raises(MissingBackendError) as info:
        reg.resolve(kind, name)
    assert isinstance(info.value, ImportError)
    assert str(info.value) == f"{name} is provided by {package}, which is not installed: pip install {package}"
    assert info.value.package == package


def test_duplicate_name_names_both_providers(make_registry, plugin_with):
    first = plugin_with(register_losses={"SharedLoss": "torch.nn:L1Loss"})
    second = plugin_with(register_losses={"SharedLoss": "torch.nn:MSELoss"})
    reg = make_registry((first, "alpha-losses"), (second, "beta-losses"))
    with pytest.raises(DuplicateComponentError) as info:
        reg.resolve("loss", "SharedLoss")
    message = str(info.value)
    assert "alpha-losses" in message and "beta-losses" in message
    assert "torch.nn:L1Loss" in message and "torch.nn:MSELoss" in message
    assert "override=True" in message
    # the conflict is confined to that name
    assert reg.resolve("loss", "CrossEntropyLoss").__name__ == "CrossEntropyLoss"
    assert ("loss", "SharedLoss") in reg.conflicts()


def test_explicit_override_wins_in_either_order(make_registry, plugin_with):
    spec = ComponentSpec("torch.nn:CrossEntropyLoss", override=True)
    override = plugin_with(register_losses={"CrossEntropyLoss": spec})
    reg = make_registry((override, "faster-ce"))
    assert reg.resolve("loss", "CrossEntropyLoss") is torch.nn.CrossEntropyLoss
    assert reg.get("loss", "CrossEntropyLoss").distribution == "faster-ce"
    # an overriding plugin registered first still beats a plain one registered later
    plain = plugin_with(register_losses={"X": "torch.nn:L1Loss"})
    over = plugin_with(register_losses={"X": ComponentSpec("torch.nn:MSELoss", override=True)})
    reg = make_registry((over, "over"), (plain, "plain"))
    assert reg.resolve("loss", "X") is torch.nn.MSELoss


def test_two_overrides_conflict(make_registry, plugin_with):
    a = plugin_with(register_losses={"X": ComponentSpec("torch.nn:L1Loss", override=True)})
    b = plugin_with(register_losses={"X": ComponentSpec("torch.nn:MSELoss", override=True)})
    with pytest.raises(DuplicateComponentError):
        make_registry((a, "a"), (b, "b")).resolve("loss", "X")


def test_listing_is_lazy_and_bad_targets_fail_on_resolution(make_registry, plugin_with):
    plugin = plugin_with(register_models={"Ghost": "twinkle_ghost_module_never_imported:Ghost"})
    reg = make_registry((plugin, "ghost-dist"))
    names = [c.name for c in reg.components("model")]
    assert "Ghost" in names
    assert "twinkle_ghost_module_never_imported" not in sys.modules
    with pytest.raises(ComponentLoadError, match="ghost-dist 1.0 points to 'twinkle_ghost_module_never_imported"):
        reg.resolve("model", "Ghost")


def test_hook_that_raises_or_returns_junk_is_skipped_with_a_warning(make_registry, plugin_with):
    class Raising:
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def register_losses(self):
            raise RuntimeError("boom")

    junk = plugin_with(register_precisions=["not", "a", "mapping"], register_patches={"P": "no-colon-here"})
    reg = make_registry((Raising(), "raising-dist"), (junk, "junk-dist"))
    with pytest.warns(TwinklePluginWarning, match="raising-dist raised in register_losses"):
        assert "CrossEntropyLoss" in reg.names("loss")
    with pytest.warns(TwinklePluginWarning, match="expected a mapping"):
        assert reg.names("precision") == []
    with pytest.warns(TwinklePluginWarning, match="'package.module:attribute'"):
        assert reg.names("patch") == ["GradientCheckpointing"]  # core's own; the junk one was skipped


def test_load_is_cached(make_registry):
    reg = make_registry()
    assert reg.load("optimizer", "SGD") is reg.load("optimizer", "SGD")
