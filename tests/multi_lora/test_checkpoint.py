"""A tenant's checkpoint resumes into any slot, written at once or in the background (issue 25, item 6).

The service pages a tenant out of one slot and back into whichever slot is free, so the files must not
name the slot: the PEFT adapter at rank r and ``optimizer.pt`` keyed by parameter order. An
asynchronous save writes host copies taken at the call on a thread of its own.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch
from hf_testing import make_batch
from ml_testing import lora, make_multi

import twinkle_hf.multi_lora.checkpoint as tenant_checkpoint
from twinkle.checkpoint import OPTIMIZER_FILE, CheckpointError, PendingSave, safe_torch_load

STEPS = 3


def _start(model, tenant="a", seed=7):
    name = model.acquire_lora(tenant, lora(4, 8), seed=seed)
    _optimizer(model, tenant)
    return name


def _optimizer(model, tenant):
    model.set_optimizer("AdamW", lr=0.02, adapter_name=tenant)
    model.set_lr_scheduler("LinearLR", start_factor=0.5, total_iters=2 * STEPS, adapter_name=tenant)


def _train(model, tenant, first, steps=STEPS):
    losses = []
    for i in range(first, first + steps):
        losses.append(float(model.forward_backward(inputs=make_batch(100 + i), adapter_name=tenant)))
        model.clip_grad_and_step(adapter_name=tenant)
    return losses


def _tenant_state(model, tenant):
    group = model._group(tenant)
    return copy.deepcopy({"weights": model.get_state_dict(adapter_name=tenant),
                          "optimizer": group.optimizer.state_dict(), "scheduler": group.lr_scheduler.state_dict(),
                          "step": group.cur_step})


def _assert_bitwise(got, want, where=""):
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            _assert_bitwise(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_bitwise(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.fixture(scope="module")
def uninterrupted():
    """Tenant 'a' trained 2*STEPS steps in one go: the run every resumed run must equal bitwise."""
    model = make_multi(max_loras=2, max_r=8)
    _start(model)
    losses = _train(model, "a", 0) + _train(model, "a", STEPS)
    return losses, _tenant_state(model, "a")


@pytest.mark.parametrize("async_save", [False, True])
def test_a_tenant_resumes_into_another_slot_bitwise(uninterrupted, tmp_path, async_save):
    model = make_multi(max_loras=2, max_r=8)
    assert _start(model) == "lora_0"
    losses = _train(model, "a", 0)
    pending = model.save("a", str(tmp_path), adapter_name="a", save_optimizer=True, async_save=async_save)
    if async_save:  # training goes on while the files are written; the checkpoint holds the state at the call
        assert isinstance(pending, PendingSave)
        _train(model, "a", 50, steps=1)
    model.release_lora("a")
    assert _start(model, "other", seed=3) == "lora_0"  # another tenant takes a's old slot and trains in it
    _train(model, "other", 60, steps=1)
    path = Path(pending.wait() if async_save else pending)
    assert sorted(p.name for p in path.iterdir() if p.name.startswith(("dcp", "optimizer"))) == [OPTIMIZER_FILE]
    assert model.load_lora("a", path) == "lora_1"
    _optimizer(model, "a")
    model.resume_from_checkpoint(str(path), adapter_name="a")
    losses += _train(model, "a", STEPS)
    want_losses, want_state = uninterrupted
    assert losses == want_losses
    _assert_bitwise(_tenant_state(model, "a"), want_state)


def test_the_background_write_holds_the_state_at_the_call(tmp_path, monkeypatch):
    """The files are written on another thread from copies: the save returns while they are still being
    written, and a step and the tenant's release meanwhile change nothing in them."""
    release, entered = threading.Event(), threading.Event()
    writer_threads = []
    original = tenant_checkpoint.torch_save

    def slow_save(obj, path):
        writer_threads.append(threading.current_thread())
        entered.set()
        assert release.wait(30)
        original(obj, path)

    monkeypatch.setattr(tenant_checkpoint, "torch_save", slow_save)
    model = make_multi(max_loras=2, max_r=8)
    _start(model)
    _train(model, "a", 0)
    before = _tenant_state(model, "a")
    pending = model.save("a", str(tmp_path), adapter_name="a", save_optimizer=True, async_save=True)
    assert entered.wait(30) and not pending.done()
    assert writer_threads[0] is not threading.main_thread()
    assert not (tmp_path / "a").exists()  # under its final name only once complete
    _train(model, "a", 50, steps=1)
    model.release_lora("a")
    release.set()
    path = Path(pending.wait())
    saved = safe_torch_load(path / OPTIMIZER_FILE)
    _assert_bitwise(saved["state"], before["optimizer"]["state"])
    model.load_lora("a", path)
    _assert_bitwise(model.get_state_dict(adapter_name="a"), before["weights"])


def test_a_failed_background_write_raises_in_wait_and_leaves_nothing(tmp_path, monkeypatch):
    def broken(obj, path):
        raise OSError("disk full")

    monkeypatch.setattr(tenant_checkpoint, "torch_save", broken)
    model = make_multi(max_loras=2, max_r=8)
    _start(model)
    _train(model, "a", 0, steps=1)
    pending = model.save("a", str(tmp_path), adapter_name="a", save_optimizer=True, async_save=True)
    with pytest.raises(OSError, match="disk full"):
        pending.wait()
    assert list(tmp_path.iterdir()) == []


def test_an_optimizer_state_of_another_shape_is_refused_before_anything_changes(tmp_path):
    small = make_multi(max_loras=1, max_r=4)
    _start(small)
    _train(small, "a", 0, steps=1)
    path = small.save("a", str(tmp_path), adapter_name="a", save_optimizer=True)
    model = make_multi(max_loras=1, max_r=8)  # slots of another max_r: the moments do not fit
    model.load_lora("a", path)
    _optimizer(model, "a")
    with pytest.raises(CheckpointError, match=r"shape \(4, 64\).*\(8, 64\)"):
        model.resume_from_checkpoint(path, adapter_name="a")
