"""The backend-neutral MultiLora manager, driven by a recording fake backend (no torch needed)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from twinkle.multi_lora import LoraTenant, MultiLora

SLOT_LAYERS = frozenset({"l0.q", "l0.v", "l1.q", "l1.v"})


@dataclass
class Cfg:
    r: int
    targets: tuple[str, ...] = ("q",)


@dataclass
class FakeBackend:
    """Keeps slot 'weights' as ints so resets and activations are observable."""

    weights: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_activation: bool = False

    def slot_targets(self) -> frozenset[str]:
        return SLOT_LAYERS

    def create_slot(self, tenant: LoraTenant) -> None:
        self.weights[tenant.adapter_name] = 0
        self.calls.append(("create", tenant.adapter_name))

    def check_tenant_config(self, config: Any) -> frozenset[str]:
        return frozenset(f"l{i}.{t}" for i in range(2) for t in config.targets)

    def activate_tenant(self, tenant: LoraTenant) -> None:
        self.weights[tenant.adapter_name] = tenant.tenant_config.r
        if self.fail_activation:
            raise OSError("device gone")

    def reset_slot(self, tenant: LoraTenant) -> None:
        self.weights[tenant.adapter_name] = 0
        self.calls.append(("reset", tenant.adapter_name))


def snapshot(manager: MultiLora, backend: FakeBackend) -> tuple:
    return ([(t.index, t.adapter_name, t.tenant_adapter_name, t.tenant_config) for t in manager.tenants],
            dict(backend.weights))


@pytest.fixture
def manager() -> tuple[MultiLora, FakeBackend]:
    backend = FakeBackend()
    return MultiLora(backend, max_loras=2, max_r=8, slot_config=Cfg(8)), backend


def test_slots_are_created_up_front_with_the_seed_fields(manager):
    ml, backend = manager
    assert backend.calls == [("create", "lora_0"), ("create", "lora_1")]
    assert [(t.index, t.adapter_name, t.config.r, t.tenant_adapter_name, t.tenant_config) for t in ml.tenants] == \
        [(0, "lora_0", 8, None, None), (1, "lora_1", 8, None, None)]
    assert ml.tenants[0].config is not ml.tenants[1].config  # peft mutates configs: one copy per slot


def test_acquire_release_cycle(manager):
    ml, backend = manager
    assert ml.acquire_lora("a", Cfg(4)) == "lora_0"
    assert ml.acquire_lora("b", Cfg(8)) == "lora_1"
    assert backend.weights == {"lora_0": 4, "lora_1": 8}
    ml.release_lora("a")
    assert backend.weights == {"lora_0": 0, "lora_1": 8}
    assert ml.tenants[0].tenant_adapter_name is None and ml.tenants[0].tenant_config is None
    assert ml.acquire_lora("c", Cfg(2)) == "lora_0"
    assert ml.names() == ["c", "b"]


@pytest.mark.parametrize("call, error, words", [
    (lambda ml: ml.acquire_lora("x", Cfg(9)), RuntimeError, "max_r=8"),
    (lambda ml: ml.acquire_lora("x", Cfg(0)), ValueError, "r >= 1"),
    (lambda ml: ml.acquire_lora("a", Cfg(2)), ValueError, "already holds slot 'lora_0'"),
    (lambda ml: ml.acquire_lora("b", Cfg(2)) and ml.acquire_lora("c", Cfg(2)), RuntimeError, "All 2 LoRA slots"),
    (lambda ml: ml.acquire_lora("x", Cfg(2, ("k",))), ValueError, "do not cover"),
    (lambda ml: ml.acquire_lora("lora_1", Cfg(2)), ValueError, "internal slot"),
    (lambda ml: ml.acquire_lora("a/b", Cfg(2)), ValueError, "identifier-like"),
    (lambda ml: ml.release_lora("nobody"), KeyError, "No tenant named 'nobody'"),
    (lambda ml: ml.resolve("lora_1"), KeyError, "is free"),
    (lambda ml: ml.resolve(None), ValueError, "adapter_name=<tenant>"),
    (lambda ml: ml.resolve("zzz"), KeyError, "No tenant named 'zzz'"),
])
def test_bad_input_is_a_clear_error_that_changes_nothing(manager, call, error, words):
    ml, backend = manager
    ml.acquire_lora("a", Cfg(4))
    before = snapshot(ml, backend)
    with pytest.raises(error, match=words):
        call(ml)
    if "All 2" not in words:
        assert snapshot(ml, backend) == before
    else:  # the second acquire failed: only 'b' (the first, valid one) was added
        assert ml.names() == ["a", "b"]


def test_failed_activation_rolls_the_slot_back(manager):
    ml, backend = manager
    backend.fail_activation = True
    with pytest.raises(OSError):
        ml.acquire_lora("a", Cfg(4))
    assert all(t.is_free for t in ml.tenants) and backend.weights == {"lora_0": 0, "lora_1": 0}


def test_resolve_accepts_tenant_and_its_slot_name_only(manager):
    ml, _ = manager
    ml.acquire_lora("a", Cfg(4))
    assert ml.resolve("a") is ml.resolve("lora_0") is ml.tenants[0]
    with ml.adapter("a") as name:
        assert name == "lora_0" and ml.resolve(None) is ml.tenants[0]
    assert ml.current() is None


def test_adapter_context_is_per_thread(manager):
    ml, _ = manager
    ml.acquire_lora("a", Cfg(4))
    ml.acquire_lora("b", Cfg(4))
    seen: dict[str, str] = {}
    inside = threading.Barrier(2)

    def run(tenant: str) -> None:
        with ml.adapter(tenant):
            inside.wait()  # both threads are inside their own block at once
            seen[tenant] = ml.resolve(None).tenant_adapter_name

    threads = [threading.Thread(target=run, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"a": "a", "b": "b"}


def test_adapter_on_unknown_tenant_raises_before_entering(manager):
    ml, _ = manager
    with pytest.raises(KeyError, match="ghost"):
        with ml.adapter("ghost"):
            pytest.fail("entered the block")
    assert ml.current() is None


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="max_loras"):
        MultiLora(FakeBackend(), max_loras=0, max_r=8, slot_config=Cfg(8))
    with pytest.raises(ValueError, match="max_r"):
        MultiLora(FakeBackend(), max_loras=1, max_r=True, slot_config=Cfg(8))
