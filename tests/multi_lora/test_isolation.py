"""Whatever tenant A does, tenant B's weights, optimizer, scheduler, progress and metrics stay bit-identical."""

from __future__ import annotations

import threading

import pytest
import torch
from hf_testing import make_batch
from ml_testing import lora, make_multi, tenant_hash

from twinkle.checkpoint import CheckpointError


def _two_tenants():
    model = make_multi(max_loras=3, max_r=8)
    for tenant, config in (("a", lora(4, 8)), ("b", lora(8, 16, "all-linear"))):
        model.multi_lora.acquire_lora(tenant, config)
        model.set_optimizer("AdamW", lr=0.01, adapter_name=tenant)
        model.set_lr_scheduler("LinearLR", start_factor=0.5, total_iters=4, adapter_name=tenant)
        model.forward_backward(inputs=make_batch(10), adapter_name=tenant)
        model.clip_grad_and_step(adapter_name=tenant)
    # b holds pending gradients and half a window of accumulation too
    model.forward_backward(inputs=make_batch(11), adapter_name="b", gradient_accumulation_steps=2)
    return model


def _raise_mid_step(model):
    def broken_loss(inputs, outputs):
        raise ArithmeticError("loss blew up")

    model.set_loss(broken_loss, adapter_name="a")
    with pytest.raises(ArithmeticError):
        model.forward_backward(inputs=make_batch(12), adapter_name="a")
    model.set_loss("CrossEntropyLoss", adapter_name="a")


def _every_operation_on_a(model, tmp_path):
    model.forward_backward(inputs=make_batch(1), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    model.calculate_metric(True, adapter_name="a")
    model.forward_only(inputs=make_batch(2), adapter_name="lora_0")
    model.calculate_loss(adapter_name="a")
    path = model.save("a1", str(tmp_path), adapter_name="a", save_optimizer=True)
    model.forward_backward(inputs=make_batch(3), adapter_name="a")
    model.step(adapter_name="a")
    model.load(path, adapter_name="a")
    model.resume_from_checkpoint(path, adapter_name="a")
    _raise_mid_step(model)
    with pytest.raises(ValueError, match="max_length"):
        model.forward_backward(inputs=make_batch(4, length=40), adapter_name="a")
    with pytest.raises(CheckpointError):
        model.load(str(tmp_path / "missing"), adapter_name="a")
    with model.multi_lora.adapter("a"):
        model.forward_backward(inputs=make_batch(5))
        model.zero_grad()
    model.multi_lora.release_lora("a")
    model.multi_lora.acquire_lora("a", lora(2, 4, ("k_proj",)))
    model.set_optimizer("SGD", lr=0.1, adapter_name="a")
    model.forward_backward(inputs=make_batch(6), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")


def test_operations_on_one_tenant_leave_the_other_bit_identical(tmp_path):
    model = _two_tenants()
    model.max_length = 32
    before = tenant_hash(model, "b")
    _every_operation_on_a(model, tmp_path)
    assert tenant_hash(model, "b") == before
    # and b still trains from exactly where it was: same result as on an untouched twin
    twin = _two_tenants()
    for m in (model, twin):
        m.forward_backward(inputs=make_batch(13), adapter_name="b")
        m.clip_grad_and_step(adapter_name="b")
    assert tenant_hash(model, "b") == tenant_hash(twin, "b")


def test_release_resets_weights_and_drops_training_state():
    model = make_multi(max_loras=1, max_r=8)
    initial = {n: [p.clone() for p in model.slots.pair(n, "lora_0")] for n in model.slots.layers}
    model.multi_lora.acquire_lora("a", lora(4, 8))
    model.set_optimizer("AdamW", lr=0.05, adapter_name="a")
    model.forward_backward(inputs=make_batch(1), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    model.multi_lora.release_lora("a")
    assert model.optimizer_group == {}
    for name, (a0, b0) in initial.items():
        a, b = model.slots.pair(name, "lora_0")
        assert torch.equal(a, a0) and torch.equal(b, b0) and a.grad is None and b.grad is None
    with pytest.raises(KeyError, match="No tenant named 'a'"):
        model.step(adapter_name="a")
    model.multi_lora.acquire_lora("c", lora(4, 8))
    assert model.optimizer_group["lora_0"].optimizer is None and model.optimizer_group["lora_0"].cur_step == 0


def test_names_never_reach_another_or_a_free_slot():
    model = make_multi(max_loras=3, max_r=8)
    model.multi_lora.acquire_lora("a", lora(4, 8))
    for name, error in (("lora_1", "is free"), ("default", "No tenant named 'default'"), ("A", "No tenant")):
        with pytest.raises(KeyError, match=error):
            model.forward_backward(inputs=make_batch(1), adapter_name=name)
    with pytest.raises(ValueError, match="adapter_name=<tenant>"):
        model.forward_backward(inputs=make_batch(1))  # even with a single tenant: no implicit slot
    with pytest.raises(TypeError, match="acquire_lora"):
        model.add_adapter_to_model("x", lora(4, 8))


def _train(model, tenant, steps, barrier=None):
    with model.multi_lora.adapter(tenant):
        for step in range(steps):
            if barrier is not None:
                barrier.wait()
            model.forward(inputs=make_batch(100 * step + len(tenant)))
            model.calculate_loss()
            model.backward()
            model.clip_grad_and_step()


def _fresh_pair():
    model = make_multi(max_loras=2, max_r=8)
    for tenant, config in (("a", lora(4, 8)), ("bb", lora(8, 8, ("o_proj", "up_proj")))):
        model.multi_lora.acquire_lora(tenant, config)
        model.set_optimizer("AdamW", lr=0.02, adapter_name=tenant)
    return model


def test_two_threads_on_two_tenants_equal_running_each_alone():
    threaded = _fresh_pair()
    barrier = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def run(tenant):
        try:
            _train(threaded, tenant, 4, barrier)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in ("a", "bb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    alone = _fresh_pair()
    _train(alone, "a", 4)
    _train(alone, "bb", 4)
    assert tenant_hash(threaded, "a") == tenant_hash(alone, "a")
    assert tenant_hash(threaded, "bb") == tenant_hash(alone, "bb")
